"""What a session did, as a model filled by the roles, and its rendering for the terminal."""

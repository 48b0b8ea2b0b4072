"""A pytest session's work: options, the process's role, checks before any test, the tests' caches, the bundle's preparation and saving."""

"""Compile expectations: each test's compile behaviour recorded in a file for review, and compared on later runs.
:mod:`.records`: one test's record; :mod:`.fileformat`: the file; :mod:`.hooks`: the plugin objects."""

"""Compile expectations: each test's compile behaviour recorded in a file for review, and compared on later runs.

:mod:`.records` is one test's record and how two records differ; :mod:`.fileformat` reads and writes the
expectations file; :mod:`.hooks` holds the two plugin objects, one beside the tests (records and compares)
and one beside the summary (gathers records from every process and writes the file once).
"""

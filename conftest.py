"""Root conftest: the test suite drives the plugin through pytester."""

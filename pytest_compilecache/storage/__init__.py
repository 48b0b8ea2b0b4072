"""Where bundles are kept (a local path or a URL), behind one interface; importing the package
imports none of its modules."""

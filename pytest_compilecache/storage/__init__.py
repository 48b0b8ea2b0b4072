"""Where bundles are kept (a local path or a URL), behind one interface; importing it imports none of its modules."""

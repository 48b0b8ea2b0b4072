"""Where bundles are kept, a local path or a URL, behind one interface (:class:`.interface.BundleStore`).

Importing the package imports none of its modules: :mod:`.urls`, which the settings use, stands alone.
:func:`.stores.open_store` opens a session's store; the rest is for the stores themselves.
"""

"""A pytest plugin that times the plugin's own steps (bundle preparation, folder filling, on-demand
placing) by wrapping them, and profiles the first test's body (cProfile), on either side of a
benchmark. Appends one JSON line to $STEPS_OUT at exit; writes the profile to $STEPS_PROFILE.

    STEPS_OUT=steps.jsonl STEPS_PROFILE=first.prof python -m pytest -p steps ...   (this folder on sys.path)
"""
import atexit, cProfile, collections, functools, importlib, json, os, time, traceback
import pytest

seconds = collections.defaultdict(float)
calls = collections.defaultdict(int)
triggers = collections.Counter()

STEPS = [
    ("pytest_compilecache.session.preparation", "BundlePreparation.prepare"),
    ("pytest_compilecache.session.preparation", "BundlePreparation._fill_session_cache"),
    ("pytest_compilecache.session.preparation", "BundlePreparation.template"),
    ("pytest_compilecache.session.preparation", "BundlePreparation.load_or_warm_up"),
    ("pytest_compilecache.session.preparation", "BundlePreparation._load"),
    ("pytest_compilecache.session.preparation", "BundlePreparation._load_binaries"),
    ("pytest_compilecache.session.preparation", "BundlePreparation._use_index"),
    ("pytest_compilecache.bundle.format", "Bundle.members"),
    ("pytest_compilecache.bundle.format", "Bundle.carried"),
    ("pytest_compilecache.bundle.format", "Bundle.read_key_index"),
    ("pytest_compilecache.bundle.keyindex", "KeyIndex.unpack"),
    ("pytest_compilecache.bundle.binaries", "BinaryPool.add_all"),
    ("pytest_compilecache.bundle.binaries", "BinaryPool.seed"),
    ("pytest_compilecache.bundle.binaries", "BinaryPool.add_from"),
    ("pytest_compilecache._torchapi", "bootstrap"),
    ("pytest_compilecache._torchapi", "environment_fingerprint"),
    ("pytest_compilecache._torchapi", "build_identity"),
    ("pytest_compilecache._torchapi", "load_artifacts"),
    ("pytest_compilecache._torchapi", "fill_warm_folder"),
    ("pytest_compilecache._torchapi", "reset_in_memory"),
    ("pytest_compilecache._torchapi.ondemand", "_link_the_rest"),
    ("pytest_compilecache._torchapi.ondemand", "_place"),
]


def _wrap(module_name, dotted):
    try:
        owner = importlib.import_module(module_name)
    except ImportError:
        return
    *path, name = dotted.split(".")
    for part in path:
        owner = getattr(owner, part, None)
        if owner is None:
            return
    original = owner.__dict__.get(name) if isinstance(owner, type) else getattr(owner, name, None)
    if original is None:
        return
    function = original.__func__ if isinstance(original, (classmethod, staticmethod)) else original

    @functools.wraps(function)
    def timed(*args, **kwargs):
        if name == "_link_the_rest":
            frames = [f for f in traceback.extract_stack()[:-1] if "site-packages/torch" in f.filename
                      or "subprocess" in f.filename or "multiprocessing" in f.filename]
            triggers[" < ".join(f"{os.path.basename(f.filename)}:{f.name}" for f in frames[-4:])] += 1
        start = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            seconds[dotted] += time.perf_counter() - start
            calls[dotted] += 1

    kind = type(original) if isinstance(original, (classmethod, staticmethod)) else (lambda f: f)
    setattr(owner, name, kind(timed))


if os.environ.get("STEPS_WRAP", "1") == "1":
    for module_name, dotted in STEPS:
        _wrap(module_name, dotted)

_profiled = [False]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    target = os.environ.get("STEPS_PROFILE")
    if not target or _profiled[0]:
        yield
        return
    _profiled[0] = True
    profile = cProfile.Profile()
    profile.enable()
    try:
        yield
    finally:
        profile.disable()
        profile.dump_stats(target)


@atexit.register
def _write():
    out = os.environ.get("STEPS_OUT")
    if out:
        with open(out, "a") as f:
            f.write(json.dumps({"seconds": seconds, "calls": calls, "triggers": triggers}) + "\n")

"""A pytest plugin that sums where a session's wall time goes: before the first test, the loop's start
to the first test, and each phase of plain and warm tests (by the test's name); appends one line to
$PHASES_OUT at exit. Also the cyclic garbage collector's passes over the whole process: how many full
(generation 2) collections ran and the seconds spent in all collections. Used by ``small_tests_vs_kept.py
--phases`` and ``gpu_vs_kept.py``:

    PHASES_OUT=phases.log python -m pytest -p phases ...   (with this file on sys.path)
"""
import time, pytest, collections, atexit, os, gc
sums = collections.defaultdict(float)
_gc_started = [0.0]
def _gc_timer(phase, info):
    if phase == "start":
        _gc_started[0] = time.perf_counter()
    else:
        sums[("gc", "seconds")] += time.perf_counter() - _gc_started[0]
        if info["generation"] == 2:
            sums[("gc", "full collections")] += 1
gc.callbacks.append(_gc_timer)
@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    t = time.perf_counter(); yield; sums[("warm" if "warm" in item.name else "plain", "setup")] += time.perf_counter() - t
@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    t = time.perf_counter(); yield; sums[("warm" if "warm" in item.name else "plain", "call")] += time.perf_counter() - t
@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item):
    t = time.perf_counter(); yield; sums[("warm" if "warm" in item.name else "plain", "teardown")] += time.perf_counter() - t
_start = time.perf_counter()
def pytest_collection_finish(session):
    sums[("all", "before first test")] = time.perf_counter() - _start
    _marks["collected"] = time.perf_counter()
@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    with open(os.environ["PHASES_OUT"], "a") as f:
        f.write(" ".join(f"{k[0]}.{k[1]}={v:.2f}" for k, v in sorted(sums.items())) + f" total={time.perf_counter()-_start:.2f}\n")
_marks = {}
@pytest.hookimpl(hookwrapper=True)
def pytest_runtestloop(session):
    _marks["loop"] = time.perf_counter()
    sums[("all", "collection finish to loop")] = _marks["loop"] - _marks.get("collected", _marks["loop"])
    yield; sums[("all", "after last test in loop")] = time.perf_counter() - _marks["last"]
@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    if "first" not in _marks:
        _marks["first"] = time.perf_counter(); sums[("all", "loop start to first test")] = _marks["first"] - _marks["loop"]
    started = time.perf_counter()
    inside = sum(v for k, v in sums.items() if k[1] in ("setup", "call", "teardown"))
    yield
    _marks["last"] = time.perf_counter()
    inside = sum(v for k, v in sums.items() if k[1] in ("setup", "call", "teardown")) - inside
    sums[("all", "per test, outside setup/call/teardown")] += _marks["last"] - started - inside
@pytest.hookimpl(hookwrapper=True)
def pytest_sessionfinish(session):
    t = time.perf_counter(); yield; sums[("all", "sessionfinish")] = time.perf_counter() - t
@pytest.hookimpl(hookwrapper=True)
def pytest_terminal_summary(terminalreporter):
    t = time.perf_counter(); yield; sums[("all", "terminal summary")] = time.perf_counter() - t

"""A pytest plugin that sums where a session's wall time goes: before the first test, the loop's start
to the first test, and each phase of plain and warm tests (by the test's name); appends one line to
$PHASES_OUT at exit. It also times the process's start to this probe's import (by /proc, to 10 ms) and
pytest's end to this probe's atexit handler (registered before the plugins', it runs after theirs and after
non-daemon threads were joined). Also the cyclic garbage collector's passes over the whole process: how
many full (generation 2) collections ran and the seconds spent in all collections. Used by ``small_tests_vs_kept.py
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
def _since_process_start():
    """Seconds from this process's start (the kernel's record, to 10 ms) to now."""
    ticks = os.sysconf("SC_CLK_TCK")
    with open("/proc/self/stat") as f:
        started = int(f.read().rsplit(")", 1)[1].split()[19]) / ticks
    with open("/proc/uptime") as f:
        return float(f.read().split()[0]) - started
sums[("all", "process start to probe import")] = _since_process_start()
_unconfigured = [0.0]
def _at_exit():
    if not _unconfigured[0]:
        return
    with open(os.environ["PHASES_OUT"], "a") as f:
        f.write(f" all.unconfigure to atexit={time.perf_counter() - _unconfigured[0]:.2f}\n")
atexit.register(_at_exit)
def pytest_collection_finish(session):
    sums[("all", "before first test")] = time.perf_counter() - _start
    _marks["collected"] = time.perf_counter()
@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    with open(os.environ["PHASES_OUT"], "a") as f:
        f.write(" ".join(f"{k[0]}.{k[1]}={v:.2f}" for k, v in sorted(sums.items())) + f" total={time.perf_counter()-_start:.2f}")
    _unconfigured[0] = time.perf_counter()
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

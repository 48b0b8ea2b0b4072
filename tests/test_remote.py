"""torch's Redis remote cache through ``--compile-cache-remote``, against a real redis-server this
test starts on loopback: remote lookups counted as their own layers, a server that does not answer
reported (and fatal in strict mode), and cold_cache never reading it."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
from typing import Callable, Iterator

import pytest

#: Real sessions against real servers and suites: left out of the fast tier (-m "not slow").
pytestmark = pytest.mark.slow

PLAIN = '''
import pytest
import torch

def test_plain():
    with torch.no_grad():
        torch.compile(lambda x: torch.sin(x) * 5 + 2, dynamic=False)(torch.randn(16))

def test_cold(cold_cache):
    with torch.no_grad():
        torch.compile(lambda x: torch.sin(x) * 5 + 2, dynamic=False)(torch.randn(16))
    cold_cache.assert_misses(fx_graph=1)
    assert not cold_cache.stats.remote_fx_graph.observable
'''

WARM_ASKS = '''

@pytest.mark.compile_cache_remote
def test_warm_asks_for_remote(warm_cache):
    with torch.no_grad():
        torch.compile(lambda x: torch.cos(x) * 7 - 1, dynamic=False)(torch.randn(16))
    assert warm_cache.stats.remote_fx_graph.observable

@pytest.mark.compile_cache_remote
def test_cold_may_not_ask(cold_cache):
    pass
'''
WARMUP = '''
import torch

def pytest_compilecache_warmup(cache):
    with torch.no_grad():
        torch.compile(lambda x: torch.tanh(x) + 3, dynamic=False)(torch.randn(16))
'''


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real redis-server on a free loopback port, without persistence, stopped afterwards."""
    server = shutil.which("redis-server")
    if server is None:
        pytest.skip("redis-server is not installed (Debian: apt-get install redis-server; .ci/run installs it)")
    pytest.importorskip("redis", reason="the redis package is not installed (pip install 'pytest-compilecache[redis]')")
    import redis

    port = free_port()
    folder = tmp_path_factory.mktemp("redis")
    proc = subprocess.Popen([server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                             "--dir", str(folder)], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    url = f"redis://127.0.0.1:{port}/0"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                redis.Redis.from_url(url, socket_connect_timeout=1).ping()
                break
            except redis.exceptions.ConnectionError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise AssertionError(f"redis-server did not start on port {port}") from None
                time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_a_second_machine_hits_what_the_first_put(pytester: pytest.Pytester, run_inner: Callable[..., pytest.RunResult],
                                                  redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs with empty local caches of their own (CI shards) sharing one Redis; a warm_cache test reads
    it only when marked, and a cold_cache test never does. A cache key tag is a key space of its own:
    the first two shards leave ``TORCH_COMPILE_CACHE_KEY_TAG`` unset (the empty tag), and the second
    hits what the first put; a third with another tag misses it (it alone pays for a fresh process:
    torch reads the tag when it is imported)."""
    pytester.makepyfile(test_r=PLAIN + WARM_ASKS)
    pytester.makeconftest(WARMUP)
    totals, warm = [], []
    for shard, tag in (("one", None), ("two", None), ("three", "suite-b")):
        monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(pytester.path / f"local-{shard}"))
        if tag is None:
            monkeypatch.delenv("TORCH_COMPILE_CACHE_KEY_TAG", raising=False)
        else:
            monkeypatch.setenv("TORCH_COMPILE_CACHE_KEY_TAG", tag)
        report = pytester.path / f"{shard}.json"
        result = run_inner(f"--compile-cache-remote={redis_url}", f"--compile-cache-report={report}", "-p",
                           "no:randomly", "--compile-cache-strict")
        result.assert_outcomes(passed=3, errors=1)
        result.stdout.fnmatch_lines([f"compilecache: remote cache {redis_url} (FX graph, AOTAutograd, autotune): reachable",
                                     "*@pytest.mark.compile_cache_remote: cold_cache never reads the remote cache*"])
        tests = json.loads(report.read_text())["tests"]
        totals.append(tests["test_r.py::test_plain"])
        warm.append(tests["test_r.py::test_warm_asks_for_remote"])
    first, second, tagged = totals
    assert warm[0]["remote_fx_graph"]["misses"] == 1 and warm[0]["remote_fx_graph"]["saved"] == 1, warm[0]
    assert warm[1]["remote_fx_graph"]["hits"] == 1, "the marked warm test of the second shard hit what the first put"
    assert first["remote_fx_graph"]["misses"] == 1 and first["remote_fx_graph"]["saved"] == 1, first
    assert first["fx_graph"]["misses"] == 1
    assert second["remote_fx_graph"]["hits"] == 1 and second["remote_fx_graph"]["misses"] == 0, second
    assert second["fx_graph"]["hits"] == 1, "a remote hit is an FX graph hit too"
    assert second["remote_aot_autograd"]["hits"] == 1, second
    assert tagged["remote_fx_graph"]["hits"] == 0 and tagged["remote_fx_graph"]["misses"] == 1, \
        "another tag never reads the first tag's entry"


def test_a_server_that_does_not_answer_is_said_and_fatal_when_strict(
        pytester: pytest.Pytester, run_inner: Callable[..., pytest.RunResult]) -> None:
    pytester.makepyfile(test_r="def test_nothing():\n    pass\n")
    url = f"redis://127.0.0.1:{free_port()}/0"
    loose = run_inner(f"--compile-cache-remote={url}")
    loose.assert_outcomes(passed=1)
    loose.stdout.fnmatch_lines([f"compilecache: remote cache {url} (FX graph, AOTAutograd, autotune): UNREACHABLE: *",
                                f"PROBLEM: remote cache {url} is unreachable (*); torch switches its remote cache off*"])
    strict = run_inner(f"--compile-cache-remote={url}", "--compile-cache-strict")
    assert strict.ret != 0
    assert "--compile-cache-strict: remote cache problem at session start" in strict.stderr.str() + strict.stdout.str()
    bad = run_inner("--compile-cache-remote=http://example.invalid/")
    assert bad.ret == pytest.ExitCode.USAGE_ERROR
    assert "is not a Redis URL" in bad.stderr.str()

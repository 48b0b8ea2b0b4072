"""Compiled C++ binaries: built once per session, carried in bundles, and never used where they do not fit."""

from __future__ import annotations

import hashlib
import json
import shutil
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

import pytest

from pytest_compilecache._torchapi.layout import find_binaries
from pytest_compilecache.bundle.binaries import CarriedBinaries, CarriedFile, build_id
from pytest_compilecache.bundle.format import Bundle, make_entry, read_manifest
from pytest_compilecache.bundle.writing import write_bundle
from pytest_compilecache.files import link_tree
from pytest_compilecache.session.pool import BinaryPool, pooled

#: Real sessions against real servers and suites: left out of the fast tier (-m "not slow").
pytestmark = pytest.mark.slow

KERNELS = """
import torch

def sine(x):
    return (x.sin() * 2 + 1).relu()

def cosine(x):
    return (x.cos() - 3).abs()

def test_a_builds(warm_cache):
    torch.compile(sine)(torch.randn(8))
    torch.compile(cosine)(torch.randn(8))

def test_b_reuses(warm_cache):
    torch.compile(sine)(torch.randn(8))
    torch.compile(cosine)(torch.randn(8))

def test_c_is_cold(cold_cache):
    torch.compile(sine)(torch.randn(8))
"""

WARMUP = """
import torch

def pytest_compilecache_warmup(cache):
    torch.compile(lambda x: x * 3)(torch.randn(4))
"""

class Kernels:
    """A project whose tests compile two kernels, run in subprocesses with a TMPDIR of their own."""

    def __init__(self, root: Path, headers: Path, run_session: Callable[..., subprocess.CompletedProcess[str]]) -> None:
        self.root = root
        self.headers = headers
        self.run_session = run_session
        (root / "test_kernels.py").write_text(KERNELS)
        (root / "conftest.py").write_text(WARMUP)
        (root / "tox.ini").write_text(f"[pytest]\ncompile_cache_headers_dir = {headers}\nverbosity_compilecache = 1\n")
        (root / "tmp").mkdir()
        self.env = {k: v for k, v in os.environ.items()
                    if k not in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "PYTEST_XDIST_WORKER", "PYTEST_ADDOPTS")}
        self.env["TMPDIR"] = str(root / "tmp")

    def run(self, bundle: Path, *extra: str, fresh: bool = False) -> dict[str, Any]:
        """Run the project's tests on ``bundle``: ``{"ret", "out", test name: its counts}``. ``fresh=True``
        starts a new process, which learns the CPU's vector instructions itself: only such a run builds
        (and carries) the CPU probes, or loads the ones a bundle carries. Otherwise the run is forked from
        the zygote, which learned them once."""
        report = bundle.with_suffix(".json")
        args = ["-p", "no:randomly", "-p", "no:cacheprovider", "-s",
                f"--compile-cache-bundle={bundle}", f"--compile-cache-report={report}", *extra]
        if fresh:
            done = subprocess.run([sys.executable, "-m", "pytest", *args], cwd=self.root, env=self.env,
                                  capture_output=True, text=True, timeout=600)
        else:
            done = self.run_session(args, self.root, self.env)
        assert "3 passed" in done.stdout, done.stdout + done.stderr
        tests = json.loads(report.read_text())["tests"]
        return {"ret": done.returncode, "out": done.stdout,
                **{nodeid.split("::")[-1]: stats for nodeid, stats in tests.items()}}


@pytest.fixture(scope="module")
def kernels(tmp_path_factory: pytest.TempPathFactory, shared_headers_dir: Path,
            run_session: Callable[..., subprocess.CompletedProcess[str]]) -> Kernels:
    return Kernels(tmp_path_factory.mktemp("kernels"), shared_headers_dir, run_session)


@pytest.fixture(scope="module")
def built(kernels: Kernels) -> tuple[Path, dict[str, Any]]:
    """A bundle saved by a cold run of the kernels' tests in a fresh process (so it carries the CPU
    probes), and that run's per-test counts."""
    bundle = kernels.root / "kernels.bundle"
    return bundle, kernels.run(bundle, fresh=True)


@pytest.fixture
def carrying(built: tuple[Path, dict[str, Any]], kernels_name_their_folder: bool) -> tuple[Path, dict[str, Any]]:
    """The built bundle, where this torch's kernels can be carried at all (not torch 2.7's: see conftest)."""
    if kernels_name_their_folder:
        pytest.skip("this torch writes a kernel's cache folder into its source: no kernel is carried")
    return built


def rewrite(source: Path, target: Path, change: Callable[[CarriedBinaries], CarriedBinaries | None]) -> None:
    """Copy a bundle with its one entry's carried binaries changed (or dropped, when ``change`` gives None)."""
    with read_manifest(source) as bundle:
        bundle.read_all()
    entry = bundle.entries[0]
    assert entry.binaries
    new = make_entry(entry.env, bundle.payload(entry), entry.artifacts, entry.created, binaries=change(entry.binaries))
    new.history = entry.history
    write_bundle(Bundle(target, [new]))


def assert_lines(out: str, patterns: list[str]) -> None:
    """Each pattern matches a line of ``out``, in this order."""
    pytest.LineMatcher(out.splitlines()).fnmatch_lines(patterns)


def shared_objects(carried: CarriedBinaries) -> list[tuple[str, str]]:
    return sorted(key for key in carried.files if key[1].endswith(".so"))


def test_a_kernel_is_built_once_per_session_and_cold_cache_stays_cold(carrying: tuple[Path, dict[str, Any]]) -> None:
    bundle_path, run = carrying
    assert run["test_a_builds"]["cpp"]["misses"] >= 2, run["test_a_builds"]
    reused = run["test_b_reuses"]
    assert reused["fx_graph"]["misses"] >= 2, "FX entries stay isolated between warm_cache tests"
    assert reused["cpp"]["misses"] == 0 and reused["cpp"]["hits"] >= 2, f"a binary was built twice: {reused}"
    assert run["test_c_is_cold"]["cpp"]["misses"] >= 1, "cold_cache must build its kernels itself"
    with read_manifest(bundle_path) as bundle:
        bundle.read_all()
    assert len(shared_objects(bundle.entries[0].binaries or CarriedBinaries())) >= 2


def test_broken_binaries_are_rebuilt_and_reported_once(
    carrying: tuple[Path, dict[str, Any]], kernels: Kernels
) -> None:
    source, _ = carrying
    tampered = kernels.root / "tampered.bundle"
    garbage = b"\x7fELF but not a shared object " * 64

    def break_all(carried: CarriedBinaries) -> CarriedBinaries:
        first, *rest = shared_objects(carried)
        carried.files[first] = replace(CarriedFile.made(*first, garbage), sha256=carried.files[first].sha256)
        for key in rest:
            carried.files[key] = CarriedFile.made(*key, garbage)
        return carried

    rewrite(source, tampered, break_all)
    # The machine's own CPU probes, where it keeps them, are placed before torch looks: without them,
    # the bundle's (broken) probes are the ones torch loads.
    headers = kernels.root / "headers-without-probes"
    link_tree(kernels.headers, headers, leave_out=("cpu-probes",))
    run = kernels.run(tampered, "--compile-cache-strict", "-o", f"compile_cache_headers_dir={headers}", fresh=True)
    assert run["ret"] == 1, "strict mode makes an unusable carried binary a problem"
    out = run["out"]
    assert out.count("fails its checksum") == 1 and f"{tampered}: carried binary" in out, out
    unloadable = [line for line in out.splitlines() if "could not be loaded" in line]
    assert unloadable and all(f"{tampered}: carried binary" in line for line in unloadable), out
    assert any("CPU feature probe" in line for line in unloadable), "probes torch loads in a child are guarded too"
    assert len(unloadable) == len(set(unloadable)), "each unusable binary is reported once"
    assert run["test_a_builds"]["cpp"]["misses"] >= 2 and run["test_a_builds"]["cpp"]["from_bundle"] == 0
    assert run["test_b_reuses"]["cpp"]["misses"] == 0, "a rebuilt kernel is not rebuilt again"
    assert run["test_a_builds"]["fx_graph"]["misses"] == 0


def test_binaries_of_another_build_are_not_used(
    carrying: tuple[Path, dict[str, Any]], kernels: Kernels
) -> None:
    source, _ = carrying
    foreign = kernels.root / "foreign.bundle"

    def elsewhere(carried: CarriedBinaries) -> CarriedBinaries:
        (identity,) = carried.builds.values()
        other = {**identity, "compiler_version": "g++ (Made Up) 1.0"}
        moved = CarriedBinaries(builds={build_id(other): other})
        for (_, path), file in carried.files.items():
            moved.add(build_id(other), path, file.content())
        return moved

    rewrite(source, foreign, elsewhere)
    run = kernels.run(foreign, "--compile-cache-strict")
    assert run["ret"] == 1, "in strict mode, binaries that fit nowhere here are a problem"
    assert_lines(run["out"], [
        "*C++ binaries: * carried, 0 fit this machine*",
        f"*{foreign}: none of its * carried binaries fits this machine (compiler_version: g++ (Made Up) 1.0 there*",
    ])
    assert run["test_a_builds"]["cpp"]["from_bundle"] == 0 and run["test_a_builds"]["cpp"]["misses"] >= 2
    assert run["test_a_builds"]["fx_graph"]["misses"] == 0, "the rest of the bundle is still used"


def test_a_build_id_that_does_not_name_its_identity_is_rejected(
    built: tuple[Path, dict[str, Any]], kernels: Kernels
) -> None:
    source, _ = built
    forged = kernels.root / "forged.bundle"

    def relabel(carried: CarriedBinaries) -> CarriedBinaries:
        (build,) = carried.builds
        carried.builds[build] = {**carried.builds[build], "compiler_version": "g++ (Made Up) 1.0"}
        return carried

    rewrite(source, forged, relabel)
    run = kernels.run(forged)
    assert_lines(run["out"], [
        "*C++ binaries: [1-9]* carried, 0 fit this machine*",
        f"*{forged}: carried binaries of build * do not match its build identity; not used*",
    ])
    assert run["test_a_builds"]["cpp"]["from_bundle"] == 0


def test_a_bundle_without_binaries_still_loads(
    built: tuple[Path, dict[str, Any]], kernels: Kernels
) -> None:
    source, _ = built
    old = kernels.root / "old.bundle"
    rewrite(source, old, lambda carried: None)
    with read_manifest(old) as bundle:
        assert bundle.entries[0].binaries_section is None, "written as a bundle from before binaries"
    run = kernels.run(old, "--compile-cache-strict")
    assert run["ret"] == 0, run["out"]
    assert run["test_a_builds"]["fx_graph"]["from_bundle"] >= 2
    assert run["test_a_builds"]["cpp"]["misses"] >= 2


def timings(*entries: tuple[str, str, float]) -> bytes:
    cache: dict[str, Any] = {}
    for op, choice, seconds in entries:
        cache.setdefault(op, {}).setdefault("inputs", {}).setdefault("highest", {})[choice] = seconds
    return json.dumps({"system": {"device": "x"}, "cache": cache}).encode()


def test_gemm_timings_are_merged_in_the_pool_and_the_bundle(tmp_path: Path) -> None:
    """torch keeps every GEMM timing of a machine in one file: pooling and bundling merge it, never replace it."""
    pool = BinaryPool(tmp_path / "pool", {"compiler": "g++"})
    first, second = tmp_path / "a", tmp_path / "b"
    for folder, data in ((first, timings(("mm", "triton_1", 1.0))),
                         (second, timings(("mm", "triton_1", 9.0), ("addmm", "aten", 2.0)))):
        (folder / "cache").mkdir(parents=True)
        (folder / "cache" / ("f" * 64)).write_bytes(data)
    assert pool.add_from(first) == 1 and pool.add_from(second) == 1
    assert pool.add_from(second) == 0, "nothing new: the pool's file is left alone"
    pooled_file = json.loads((pool.path / "cache" / ("f" * 64)).read_text())["cache"]
    assert pooled_file["mm"]["inputs"]["highest"] == {"triton_1": 1.0}, "a timing already pooled is kept"
    assert pooled_file["addmm"]["inputs"]["highest"] == {"aten": 2.0}

    test_folder = tmp_path / "test"
    (test_folder / "cache").mkdir(parents=True)
    (test_folder / "cache" / ("f" * 64)).write_bytes(timings(("bmm", "aten", 3.0)))
    pool.seed(test_folder)
    seeded = json.loads((test_folder / "cache" / ("f" * 64)).read_text())["cache"]
    assert set(seeded) == {"mm", "addmm", "bmm"}, "seeding merges into a folder's own timings"

    one, two = CarriedBinaries(), CarriedBinaries()
    one.add("b", "cache/" + "f" * 64, timings(("mm", "x", 1.0)))
    two.add("b", "cache/" + "f" * 64, timings(("bmm", "y", 2.0)))
    two.add("b", "cache/" + "f" * 64, b"not json")
    (merged,) = CarriedBinaries.union([one, two]).files.values()
    assert set(json.loads(merged.content())["cache"]) == {"mm", "bmm"}
    assert merged.sha256 == hashlib.sha256(merged.content()).hexdigest()


def test_a_triton_kernel_still_being_written_is_not_pooled(tmp_path: Path) -> None:
    """A kernel folder whose group file names a file not yet there is left alone, so no test gets half a kernel."""
    kernel = tmp_path / "cache" / "triton" / ("k" * 20)
    kernel.mkdir(parents=True)
    group = {"child_paths": {"k.cubin": str(kernel / "k.cubin"), "k.json": str(kernel / "k.json")}}
    (kernel / "__grp__k.json").write_text(json.dumps(group))
    (kernel / "k.json").write_text("{}")
    pool = BinaryPool(tmp_path / "pool", {"compiler": "g++"})
    assert pool.add_from(tmp_path / "cache") == 0
    (kernel / "k.cubin").write_bytes(b"\x00" * 16)
    assert pool.add_from(tmp_path / "cache") == 3
    seeded = tmp_path / "test"
    pool.seed(seeded)
    relocated = json.loads((seeded / "triton" / ("k" * 20) / "__grp__k.json").read_text())
    assert relocated["child_paths"]["k.cubin"] == str(seeded / "triton" / ("k" * 20) / "k.cubin")


def test_tritons_compiled_helper_modules_are_pooled_and_carried(tmp_path: Path) -> None:
    """Triton compiles its driver's helpers (``cuda_utils``) and kernel launchers from C with the system
    compiler, into a folder of its cache with no group file; a new cache folder builds them again
    (0.3-0.4 s a process on an H100 host) unless they are pooled like the kernels. A module written
    while its folder is read (Triton's temporary folder beside it) is not taken half-written."""
    key = "m" * 52
    module = tmp_path / "cache" / "triton" / key
    module.mkdir(parents=True)
    name = "cuda_utils.cpython-312-x86_64-linux-gnu.so"
    (module / name).write_bytes(b"\x7fELF" + b"\x00" * 32)
    (module / "tmp.pid_12_34").mkdir()
    (module / "tmp.pid_12_34" / "__triton_launcher.so").write_bytes(b"half")
    half = tmp_path / "cache" / "triton" / ("k" * 20)
    half.mkdir()
    (half / "k.cubin").write_bytes(b"\x00" * 16)  # a kernel whose group file is not written yet
    (half / "k.so").write_bytes(b"\x00" * 16)  # (on backends whose kernels are shared libraries)
    assert set(find_binaries(tmp_path / "cache")) == {f"triton/{key}/{name}"}
    pool = BinaryPool(tmp_path / "pool", {"compiler": "g++"})
    assert pool.add_from(tmp_path / "cache") == 1
    seeded = tmp_path / "test"
    pool.seed(seeded)
    assert (seeded / "triton" / key / name).read_bytes() == (module / name).read_bytes()
    carried = pooled(tmp_path / "pool")
    assert {path for _, path in carried.files} == {f"triton/{key}/{name}"}
    assert carried.triton_counts() == {"count": 0, "bytes": 36}, "a helper module is no kernel, its bytes count"
    assert carried.counts()["count"] == 0, "nor a C++ binary of torch's"

    assert pool.add_from(seeded) == 0, "a folder seeded from the pool gives nothing back"
    rebuilt = tmp_path / "rebuilt" / "triton" / key
    rebuilt.mkdir(parents=True)
    (rebuilt / name).write_bytes(b"\x7fELF rebuilt")  # Triton could not load the pooled one: built again
    assert pool.add_from(tmp_path / "rebuilt") == 1
    assert (pool.path / "triton" / key / name).read_bytes() == b"\x7fELF rebuilt", "the one that loads is kept"
    assert (seeded / "triton" / key / name).read_bytes() != b"\x7fELF rebuilt", "a folder's own link is left alone"


def test_an_updating_warmup_uses_the_carried_binaries(kernels: Kernels, carrying: tuple[Path, dict[str, Any]],
                                                      tmp_path: Path) -> None:
    """With --compile-cache-update the warmup runs again over the loaded bundle: its graphs hit, and
    their C++ kernels come from the bundle's carried binaries, not from a rebuild."""
    bundle = tmp_path / "update.bundle"
    bundle.write_bytes(carrying[0].read_bytes())
    kernels.run(bundle, "--compile-cache-update")
    process = json.loads(bundle.with_suffix(".json").read_text())["bundle"]["processes"][0]
    assert process["warmup_seconds"] is not None, "the warmup ran again"
    stats = process["warmup_stats"]
    assert stats["fx_graph"]["hits"] >= 1 and stats["fx_graph"]["misses"] == 0, stats["fx_graph"]
    assert stats["cpp"]["misses"] == 0 and stats["cpp"]["from_bundle"] >= 1, stats["cpp"]


def test_a_seeded_folder_gets_what_another_process_pools_later(tmp_path: Path) -> None:
    """Seeding skips a folder it already filled while the pool is unchanged, and catches up once any
    process (here a second pool object on the same folder) adds to or drops from it."""
    identity = {"compiler": "g++"}
    ours, theirs = BinaryPool(tmp_path / "pool", identity), BinaryPool(tmp_path / "pool", identity)
    built = tmp_path / "built"
    (built / "ab").mkdir(parents=True)
    (built / "ab" / "cfirst.so").write_bytes(b"first")
    assert theirs.add_from(built) == 1
    template = tmp_path / "template"
    assert ours.seed(template) == 1
    assert ours.seed(template) == 0
    (built / "ab" / "csecond.so").write_bytes(b"second")
    assert theirs.add_from(built) == 1
    assert ours.seed(template) == 1, "the other process's binary reaches the next test"
    assert (template / "ab" / "csecond.so").read_bytes() == b"second"
    (template / "ab" / "csecond.so").unlink()
    assert ours.seed(template) == 0, "an unchanged pool is not walked again"
    assert not (template / "ab" / "csecond.so").exists()
    ours.seed(tmp_path / "another")
    assert (tmp_path / "another" / "ab" / "csecond.so").exists(), "another folder is seeded in full"
    (template / "ab" / "csecond.so").write_bytes(b"second")
    theirs.drop(["cfirst.so"], template)
    assert not (theirs.path / "ab" / "cfirst.so").exists()
    version = (ours.path / "version").read_text()
    assert ours.seed(template) == 0 and (ours.path / "version").read_text() == version
    assert not (template / "ab" / "cfirst.so").exists(), "a dropped binary is not seeded again"


def test_pooling_a_test_folder_since_its_start_finds_what_the_test_wrote(tmp_path: Path) -> None:
    """Harvesting a warm test's folder looks only in folders changed since the test began, and still
    finds a binary written into a folder that the template's links had made."""
    identity = {"compiler": "g++"}
    pool = BinaryPool(tmp_path / "pool", identity)
    template = tmp_path / "template"
    for sub in ("ab", "cd"):
        (template / sub).mkdir(parents=True)
        (template / sub / f"c{sub}.so").write_bytes(sub.encode())
    assert pool.add_from(template) == 2
    test = tmp_path / "test"
    pool.seed(test)
    old = time.time() - 60
    for sub in ("ab", "cd"):
        os.utime(test / sub, (old, old))
    (tmp_path / "clock").touch()  # the file system's clock, coarser than time.time(): a file written just after
    start = (tmp_path / "clock").stat().st_mtime  # time.time() may carry an earlier mtime
    (test / "ab" / "cnew.so").write_bytes(b"built in the test")
    assert set(find_binaries(test, since=start)) == {"ab/cab.so", "ab/cnew.so"}, "the untouched folder is skipped"
    assert pool.add_from(test, since=start) == 1
    assert (pool.path / "ab" / "cnew.so").read_bytes() == b"built in the test"


def test_a_pool_on_another_file_system_seeds_copies(tmp_path: Path) -> None:
    """Where a hard link cannot be made (the pool and the folder on two file systems), seeding copies
    each binary whole, and a file already there is left as it is."""
    shm = Path("/dev/shm")
    if not shm.is_dir() or os.stat(shm).st_dev == os.stat(tmp_path).st_dev or not os.access(shm, os.W_OK):
        pytest.skip("needs /dev/shm writable on a file system of its own")
    root = Path(tempfile.mkdtemp(dir=shm))
    try:
        pool = BinaryPool(root / "pool", {"compiler": "g++"})
        built = tmp_path / "built"
        (built / "ab").mkdir(parents=True)
        (built / "ab" / "cone.so").write_bytes(b"one")
        (built / "ab" / "ctwo.so").write_bytes(b"two")
        assert pool.add_from(built) == 2
        folder = tmp_path / "folder"
        (folder / "ab").mkdir(parents=True)
        (folder / "ab" / "ctwo.so").write_bytes(b"mine")
        assert pool.seed(folder) == 1
        assert (folder / "ab" / "cone.so").read_bytes() == b"one"
        assert os.stat(folder / "ab" / "cone.so").st_dev != os.stat(pool.path / "ab" / "cone.so").st_dev
        assert (folder / "ab" / "ctwo.so").read_bytes() == b"mine", "a file already there is kept"
        assert sorted(p.name for p in (folder / "ab").iterdir()) == ["cone.so", "ctwo.so"], "no temporary left"
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_a_binary_whose_source_names_its_own_cache_folder_is_not_carried(tmp_path: Path) -> None:
    """torch 2.7's C++ kernels include their prefix header by its absolute path in the cache folder, so
    the kernel's key (its source and command line) differs in every folder: carried, it would never be
    found, and each updating run would add another copy. Such a binary stays where it was built."""
    cache = tmp_path / "cache"
    (cache / "tx").mkdir(parents=True)
    (cache / "tx" / "ctx.cpp").write_text(f'#include "{cache}/pi/cpi.h"\nextern "C" void kernel() {{}}\n')
    (cache / "tx" / "ctx.so").write_bytes(b"\x7fELF")
    (cache / "ab").mkdir()
    (cache / "ab" / "cab.cpp").write_text('#include <ATen/cpu/vec/vec.h>\nextern "C" void kernel() {}\n')
    (cache / "ab" / "cab.so").write_bytes(b"\x7fELF")
    assert set(find_binaries(cache)) == {"ab/cab.cpp", "ab/cab.so"}


NOT_SAVED = """
import torch

def sine(x):
    return (x.sin() * 2 + 1).relu()

def pytest_compilecache_warmup(cache):
    torch.compile(sine)(torch.randn(8))
"""


def test_what_a_not_saved_block_compiles_carries_no_binary(pytester: pytest.Pytester, run_inner,
                                                             kernels_name_their_folder: bool) -> None:
    """A kernel built inside ``not_saved()`` stays out of the bundle with its graph: the bundle carries the
    warmup's kernel alone (a later test of the session still gets it from the session's pool or builds it)."""
    if kernels_name_their_folder:
        pytest.skip("this torch writes a kernel's cache folder into its source: no kernel is carried")
    pytester.makeconftest(NOT_SAVED)
    pytester.makepyfile(test_variant="""
import torch
from conftest import sine

def test_variant(warm_cache):
    torch.compile(sine)(torch.randn(8))
    with warm_cache.not_saved():
        torch.compile(lambda x: (x.cos() - 3).abs())(torch.randn(8))
""")
    bundle = pytester.path / "b.bundle"
    run_inner(f"--compile-cache-bundle={bundle}").assert_outcomes(passed=1)
    with read_manifest(bundle) as read:
        carried, _ = read.carried(read.entries[0])
        sources = {path: file.content() for (_, path), file in carried.files.items() if path.endswith(".cpp")}
    assert any(b"sin" in source for source in sources.values()), sources.keys()
    assert not [path for path, source in sources.items() if b"cos" in source], "the not_saved() kernel was carried"


def test_a_pooled_file_that_cannot_be_placed_is_counted_not_swallowed(tmp_path: Path) -> None:
    """A file the pool cannot place is left to torch to build, and counted as caught, for ``-v`` and the report."""
    from pytest_compilecache import caught

    before = caught.counts().get("placing a pooled compiled file (FileNotFoundError)", 0)
    pool = BinaryPool(tmp_path / "pool", {"compiler": "g++"})
    assert pool.put(tmp_path / "cache", ["ab/cgone.so"]) == 0
    assert caught.counts()["placing a pooled compiled file (FileNotFoundError)"] == before + 1

"""Hostile bundles: a fast seeded subset of scripts/fuzz_bundles.py, and the bugs it found, each by name."""

from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import sys
import tracemalloc
import zlib
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any, Iterator

import pytest

pytest.importorskip("torch")

from pytest_compilecache import cli
from pytest_compilecache.bundle.binaries import BinaryDamaged, CarriedBinaries
from pytest_compilecache.bundle.format import BundleError, read_manifest

#: Real sessions against real servers and suites: left out of the fast tier (-m "not slow").
pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "fuzz_bundles.py"
SEED = 20261123
FAST_CASES = 104


def _load_script() -> Any:
    spec = importlib.util.spec_from_file_location("fuzz_bundles", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["fuzz_bundles"] = module
    spec.loader.exec_module(module)
    return module


fuzz = _load_script()


@pytest.fixture(scope="module")
def user_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder that stands for the developer's home (HOME and XDG_CACHE_HOME) while the real bundle is made."""
    return tmp_path_factory.mktemp("user-home")


@pytest.fixture(scope="module")
def harness(tmp_path_factory: pytest.TempPathFactory, user_home: Path, shared_headers_dir: Path) -> Iterator[Any]:
    """The fuzzer's harness around real bundles: made by a pytest run that really compiles, then signed."""
    real = fuzz.build_real_bundle(tmp_path_factory.mktemp("real"), headers=shared_headers_dir,
                                  env={"HOME": str(user_home), "XDG_CACHE_HOME": str(user_home / ".cache")})
    seeds = fuzz.Seeds.from_real(real, tmp_path_factory.mktemp("seeds"))
    yield fuzz.Harness(seeds, tmp_path_factory.mktemp("fuzz"))


def test_the_bundle_builder_writes_nothing_into_the_users_home(harness: Any, user_home: Path) -> None:
    """Item 14 of issue 20: the script's bundle builder set no plugin home and filled
    ~/.cache/pytest-compilecache; its run gets a home of its own beside the bundle."""
    assert sorted(str(p.relative_to(user_home)) for p in user_home.rglob("*")) == []


def test_seeded_subset_breaks_no_invariant(harness: Any) -> None:
    """Every mutation class, through the reader, BundlePreparation.load_or_warm_up (torch's load instrumented) and
    every CLI command, with and without the key: no traceback, no hang, nothing rejected reaches torch."""
    tally, failed = fuzz.run_cases(harness, SEED, range(FAST_CASES))
    assert not failed, "\n".join(fuzz.describe_failure(SEED, case, outcome) for case, outcome in failed[:5])
    assert set(tally.cases) == set(fuzz.MUTATIONS) and sum(tally.cases.values()) == FAST_CASES
    assert sum(n for (_, r), n in tally.reader.items() if r == "accepted") > FAST_CASES // 10
    assert sum(n for (_, r), n in tally.loaded.items() if r == "key:loaded") > 0, "signed, intact entries do load"


def _crafted(harness: Any, change: Any, base: str = "plain") -> bytes:
    manifest, body = fuzz.split(harness.seeds.bundles[base])
    change(manifest)
    return fuzz.join(fuzz.dumps(manifest), body)


def _run(harness: Any, data: bytes) -> Any:
    return harness.run(fuzz.Case(-1, "regression", "regression", data))


def _cli(*argv: str) -> tuple[int, str, str]:
    out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="strict")
    err = io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        rc = cli.main(list(argv))
        out.flush()
    return rc, out.buffer.getvalue().decode(), err.getvalue()  # type: ignore[attr-defined]


def test_regression_non_ascii_signature_is_a_mismatch_not_a_type_error(harness: Any, tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """hmac.compare_digest refuses non-ASCII str: a signature of "\\ud800" raised TypeError everywhere."""
    path = tmp_path / "sig.bundle"
    path.write_bytes(_crafted(harness, lambda m: m["entries"][0].update(signature="\ud800é"), "signed"))
    monkeypatch.setenv("PYTEST_COMPILE_CACHE_KEY", fuzz.KEY)
    with read_manifest(path) as bundle:
        assert "signature does not match" in bundle.signature_problem(bundle.entries[0], fuzz.KEY.encode())
    rc, _, err = _cli("verify", str(path))
    assert rc == 1 and str(path) in err and "signature does not match" in err
    assert not _run(harness, path.read_bytes()).violations


@pytest.mark.parametrize("value", ["@@RAW:1" + "0" * 400 + "@@", "@@RAW:-" + "9" * 4000 + "@@"])
@pytest.mark.parametrize("field", ["created", "size", "offset"])
def test_regression_a_huge_integer_is_rejected_not_an_overflow(harness: Any, tmp_path: Path, field: str,
                                                               value: str) -> None:
    """math.isfinite(10**400) raises OverflowError; it escaped read_manifest and every command."""
    path = tmp_path / "huge.bundle"
    path.write_bytes(_crafted(harness, lambda m: m["entries"][0].update({field: value})))
    with pytest.raises(BundleError, match="entries are malformed"):
        read_manifest(path)
    assert not _run(harness, path.read_bytes()).violations


@pytest.mark.parametrize("stamp", [1e30, 1e308, -1e308])
def test_regression_a_date_no_calendar_holds_is_shown_as_a_number(harness: Any, tmp_path: Path, stamp: float) -> None:
    """time.localtime(1e30) raises OverflowError: inspect printed a traceback for a finite, absurd date."""
    path = tmp_path / "date.bundle"
    path.write_bytes(_crafted(harness, lambda m: m["entries"][0].update(created=stamp)))
    rc, out, err = _cli("inspect", str(path))
    assert rc == 0 and "(not a date)" in out, err
    assert not _run(harness, path.read_bytes()).violations


def test_regression_hostile_env_text_stays_one_printable_line(harness: Any, tmp_path: Path) -> None:
    """Env values with a line break or a lone surrogate: verify's error took two lines, inspect raised
    UnicodeEncodeError on a UTF-8 stdout."""
    path = tmp_path / "env.bundle"
    path.write_bytes(_crafted(harness, lambda m: m["entries"][0]["env"].update(
        torch="2.13\nFAKE OK", device="\ud800\u202e\x1b[31m")))
    rc, _, err = _cli("verify", str(path))
    assert rc == 1 and len(err.strip().splitlines()) == 1 and "2.13\\nFAKE OK" in err, err
    rc, out, err = _cli("inspect", str(path))
    assert rc == 0 and "\\ud800\\u202e\\x1b[31m" in out, err
    assert not _run(harness, path.read_bytes()).violations


def test_regression_a_failed_merge_names_its_inputs(harness: Any, tmp_path: Path) -> None:
    """Two entries for one machine whose payload torch cannot read: the merge error named no file."""
    parts = fuzz.Parts.of(harness.seeds.bundles["pair"])
    parts.set_payload(0, b"not mega-cache bytes")
    path = tmp_path / "garbage.bundle"
    path.write_bytes(parts.build())
    out = tmp_path / "out.bundle"
    rc, _, err = _cli("merge", str(harness.original), str(path), "-o", str(out))
    assert rc == 2 and str(path) in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists()
    assert not _run(harness, path.read_bytes()).violations


def test_regression_a_zlib_bomb_among_carried_binaries_is_not_inflated() -> None:
    """A carried file stated at 10 bytes whose stored form inflates to 50 MB: unpack inflated all of it."""
    stored = zlib.compress(b"\0" * 50_000_000, 9)
    section = {"offset": 0, "size": len(stored), "sha256": hashlib.sha256(stored).hexdigest(),
               "builds": {}, "files": []}
    from pytest_compilecache.bundle.binaries import build_id

    identity = {"compiler": "x"}
    section["builds"] = {build_id(identity): identity}
    section["files"] = [[build_id(identity), "ab/bomb.so", "0" * 64, 10, len(stored)]]
    listing = CarriedBinaries.of_section(section, lambda at, size: stored[at:at + size])
    tracemalloc.start()
    try:
        carried, problems = listing.checked()
        with pytest.raises(BinaryDamaged, match="carried binary ab/bomb.so fails its checksum; not used"):
            listing.fitting(build_id(identity))["ab/bomb.so"].content()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert not carried and problems == ["carried binary ab/bomb.so fails its checksum; not used"]
    assert peak < 5_000_000, f"{peak} bytes allocated to check a 10-byte file"


@pytest.mark.parametrize("size", [2 ** 63 - 1, 2 ** 63, 2 ** 64 + 7])
def test_regression_a_huge_stated_binary_size_is_a_checksum_problem(harness: Any, size: int, tmp_path: Path) -> None:
    """Found by the full run (seed 20261123, case 2098): the bounded inflate above took ``size + 1`` as
    a C ssize_t, and a stated size of 2**63 raised OverflowError from carried()."""
    path = tmp_path / "size.bundle"
    path.write_bytes(_crafted(harness, lambda m: m["entries"][0]["binaries"]["files"][-1].__setitem__(3, size)))
    with read_manifest(path) as bundle:
        _, problems = bundle.carried(bundle.entries[0], check=True)
    assert len(problems) == 1 and "fails its checksum" in problems[0] and str(path) in problems[0]
    assert not _run(harness, path.read_bytes()).violations


def test_the_script_replays_one_case_from_its_seed(harness: Any) -> None:
    """The same seed and index give the same bytes, so a failure printed by the full run can be replayed."""
    one = fuzz.generate(harness.seeds, SEED, 7, harness.ctx)
    two = fuzz.generate(harness.seeds, SEED, 7, harness.ctx)
    assert one.data == two.data and one.how == two.how
    assert json.loads(json.dumps(one.how)) == one.how

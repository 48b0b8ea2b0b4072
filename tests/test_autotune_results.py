"""Issue 22: a kernel's autotune result in a bundle is the one that saves a warm test from measuring.

torch keeps one autotune result per kernel, in one file (``<cache>/<xx>/<name>.best_config``), and
Mega-Cache writes every recorded result for it in order, so the last one written wins. A kernel
tuned with coordinate descent is saved twice in a building run (the best of its configs, then the
result of coordinate descent); bundles merged from several sessions can hold both, in any order.
When a result not found by coordinate descent wins, a warm max-autotune test runs coordinate
descent again: it benchmarks, and writes a result (seen on an H200 as a warm test taking 1.11 s
instead of 0.15 s with ``autotune saved: 1``). These tests use torch's own artifact classes,
serializer and loader (CPU is enough: nothing is compiled).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from pytest_compilecache import _torchapi  # noqa: E402
from pytest_compilecache._torchapi import megacache  # noqa: E402

KEY = "ab/cabcdef0123456789.best_config"


def result(found_by_coordesc: bool, block: int) -> dict[str, object]:
    """An autotune result as ``AutotuneCache.save`` writes it."""
    return {"XBLOCK": block, "num_warps": 4, "num_stages": 1, "configs_hash": "f" * 64,
            "found_by_coordesc": found_by_coordesc, "time_taken_ms": block, "triton_cache_hash": None}


def payload(*results: dict[str, object], key: str = KEY) -> bytes:
    megacache._manager()
    from torch.compiler._cache import CacheArtifactFactory

    artifacts = [CacheArtifactFactory.encode_create("autotune", key, content) for content in results]
    return megacache._serialize({"autotune": artifacts})


def loaded(data: bytes, folder: Path, key: str = KEY) -> dict[str, object]:
    _torchapi.load_artifacts(data, str(folder))
    return json.loads((folder / key).read_bytes())


def test_a_heuristic_result_written_after_the_coordinate_descent_one_does_not_win(tmp_path: Path) -> None:
    coordesc, heuristic = result(True, 64), result(False, 128)
    assert loaded(payload(coordesc, heuristic), tmp_path) == coordesc


def test_a_merge_keeps_one_result_per_kernel_the_coordinate_descent_one(tmp_path: Path) -> None:
    coordesc, heuristic = result(True, 64), result(False, 128)
    merged = _torchapi.merge_artifacts([payload(coordesc), payload(heuristic)])
    assert [(kind, key) for kind, key, _ in _torchapi.artifact_sizes(merged)] == [("autotune", KEY)]
    assert loaded(merged, tmp_path) == coordesc


def test_among_results_of_one_kind_the_last_written_wins(tmp_path: Path) -> None:
    older, newer = result(True, 64), result(True, 32)
    assert loaded(_torchapi.merge_artifacts([payload(older), payload(newer)]), tmp_path) == newer
    plain_old, plain_new = result(False, 64), result(False, 32)
    assert loaded(payload(plain_old, plain_new), tmp_path / "plain") == plain_new


def test_results_of_other_kernels_are_all_kept(tmp_path: Path) -> None:
    other = "cd/cother0123456789.best_config"
    merged = _torchapi.merge_artifacts([payload(result(True, 64)), payload(result(False, 16), key=other)])
    assert sorted(key for _, key, _ in _torchapi.artifact_sizes(merged)) == [KEY, other]
    assert loaded(merged, tmp_path, other) == result(False, 16)

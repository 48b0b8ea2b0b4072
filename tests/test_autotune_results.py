"""Issue 22: a kernel's autotune result in a bundle is the one that saves a warm test from measuring.

torch keeps one autotune result per kernel, in one file (``<cache>/<xx>/<name>.best_config``), and
Mega-Cache writes every recorded result for it in order, so the last one written wins. A kernel
tuned with coordinate descent is saved twice in a building run (the best of its configs, then the
result of coordinate descent); bundles merged from several sessions can hold both, in any order.
When a result not found by coordinate descent wins, a warm max-autotune test runs coordinate
descent again: it benchmarks and writes a result. A kernel loaded from the FX graph cache loses
the mark another way on torch 2.11 (``recheck_autotune_cache``; the cause of the re-measurement
seen on an H200): the last tests. These tests use torch's own artifact classes, serializer,
loader, autotune cache and recheck (CPU is enough: nothing is compiled).
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any, Callable

import pytest

torch = pytest.importorskip("torch")

from pytest_compilecache import _torchapi  # noqa: E402
from pytest_compilecache._torchapi import megacache  # noqa: E402
from pytest_compilecache.bundle.format import make_entry, payload_of  # noqa: E402
from pytest_compilecache.bundle.merge import union  # noqa: E402

KEY = "ab/cabcdef0123456789.best_config"


def result(found_by_coordesc: bool, block: int) -> dict[str, object]:
    """An autotune result as ``AutotuneCache.save`` writes it."""
    return {"XBLOCK": block, "num_warps": 4, "num_stages": 1, "configs_hash": "f" * 64,
            "found_by_coordesc": found_by_coordesc, "time_taken_ms": block, "triton_cache_hash": None}


def payload(*results: dict[str, object], key: str = KEY) -> bytes:
    megacache._manager()
    from torch.compiler import _cache

    factory = getattr(_cache, "CacheArtifactFactory", None)
    if factory is not None:
        artifacts = [factory.encode_create("autotune", key, content) for content in results]
    else:  # torch 2.7: one artifact class whose type is an enum, autotune content encoded as JSON
        from torch._inductor.remote_cache import RemoteCacheJsonSerde

        artifacts = [_cache.CacheArtifact(_cache.CacheArtifactType.AUTOTUNE, key, RemoteCacheJsonSerde().encode(content))
                     for content in results]
    return megacache._serialize({"autotune": artifacts})


def merged(*blobs: bytes) -> bytes:
    """The Mega-Cache bytes of the entry a bundle merge makes of entries holding ``blobs``, in that order."""
    (entry,) = union([make_entry({"torch": "here"}, blob, {}, created=n + 1.0) for n, blob in enumerate(blobs)])
    return payload_of(entry, "merged")


def keys(data: bytes) -> list[tuple[str, str]]:
    return [(kind, key) for kind, key, _ in _torchapi.artifact_contents(data)]


def loaded(data: bytes, folder: Path, key: str = KEY) -> dict[str, object]:
    _torchapi.load_artifacts(data, str(folder))
    return json.loads((folder / key).read_bytes())


def test_a_heuristic_result_written_after_the_coordinate_descent_one_does_not_win(tmp_path: Path) -> None:
    coordesc, heuristic = result(True, 64), result(False, 128)
    assert loaded(payload(coordesc, heuristic), tmp_path) == coordesc


def test_a_merge_keeps_one_result_per_kernel_the_coordinate_descent_one(tmp_path: Path) -> None:
    coordesc, heuristic = result(True, 64), result(False, 128)
    for blobs in [(payload(coordesc), payload(heuristic)), (payload(heuristic), payload(coordesc))]:
        both = merged(*blobs)
        assert keys(both) == [("autotune", KEY)]
        assert loaded(both, tmp_path) == coordesc


def test_among_results_of_one_kind_the_last_written_wins(tmp_path: Path) -> None:
    older, newer = result(True, 64), result(True, 32)
    assert loaded(merged(payload(older), payload(newer)), tmp_path) == newer
    plain_old, plain_new = result(False, 64), result(False, 32)
    assert loaded(payload(plain_old, plain_new), tmp_path / "plain") == plain_new


def test_results_of_other_kernels_are_all_kept(tmp_path: Path) -> None:
    other = "cd/cother0123456789.best_config"
    both = merged(payload(result(True, 64)), payload(result(False, 16), key=other))
    assert sorted(key for _, key in keys(both)) == [KEY, other]
    assert loaded(both, tmp_path, other) == result(False, 16)


class _Config:
    """Triton's ``Config`` where triton is absent (a CPU build of torch): its kwargs, warps and stages."""

    def __init__(self, kwargs: dict[str, int], num_warps: int = 4, num_stages: int = 1, **_: object) -> None:
        self.kwargs, self.num_warps, self.num_stages = dict(kwargs), num_warps, num_stages


def _skip_without_recheck() -> None:
    from torch._inductor.runtime import triton_heuristics

    if not hasattr(triton_heuristics, "check_autotune_cache") or \
            not hasattr(triton_heuristics.CachingAutotuner, "recheck_autotune_cache"):
        pytest.skip(f"torch {torch.__version__} does not recheck a kernel's autotune result when it is loaded "
                    "(no check_autotune_cache / CachingAutotuner.recheck_autotune_cache): nothing to keep a mark on")


def _reloaded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, found_by_coordesc: bool,
              torch_recheck: Callable[..., Any] | None = None) -> tuple[object, object]:
    """A statically launchable kernel with three configs whose autotune result (the second config) is
    on disk, loaded as from the FX graph cache: torch's own ``recheck_autotune_cache`` (or
    ``torch_recheck``), cache and result format, with the plugin's wrappers from its register of
    patches; only the compiled kernels are stand-ins. Its kept compile result, and the one expected."""
    from torch._inductor.runtime import autotune_cache, triton_heuristics

    from pytest_compilecache._torchapi import autotune

    autotuner = triton_heuristics.CachingAutotuner
    _skip_without_recheck()
    create = inspect.unwrap(autotune_cache.AutotuneCache.create)
    monkeypatch.setattr(autotune_cache.AutotuneCache, "create", staticmethod(autotune.wrap_create(create)))
    check = inspect.unwrap(triton_heuristics.check_autotune_cache)
    monkeypatch.setattr(triton_heuristics, "check_autotune_cache", autotune.wrap_check(check))
    recheck = torch_recheck or inspect.unwrap(autotuner.recheck_autotune_cache)
    monkeypatch.setattr(autotuner, "recheck_autotune_cache", autotune.wrap_recheck(recheck))

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    try:
        triton_heuristics.Config({"XBLOCK": 1}, num_warps=4, num_stages=1)
        config_class = triton_heuristics.Config
    except TypeError:  # no triton here: torch's placeholder takes no arguments
        monkeypatch.setattr(autotune_cache, "Config", _Config)
        config_class = _Config
    configs = [config_class({"XBLOCK": block}, num_warps=4, num_stages=1) for block in (64, 128, 256)]
    filename = str(tmp_path / "ab" / "cabcdef.py")
    meta = {"coordinate_descent_tuning": True, "autotune_local_cache": True}
    cache = autotune_cache.AutotuneCache.create(meta, filename, triton_heuristics.hash_configs(configs))
    assert cache is not None
    cache.save(configs[1], 5_000_000, found_by_coordesc=found_by_coordesc)
    results = [object.__new__(triton_heuristics.StaticTritonCompileResult) for _ in configs]
    for compiled, config in zip(results, configs):
        compiled.config = config
    class StandIn(triton_heuristics.CachingAutotuner):  # type: ignore[misc]
        _could_rblock_scale = False  # torch 2.15 asks whether it may scale RBLOCK; a stand-in has no sizes

    kernel = object.__new__(StandIn)
    kernel.compile_results, kernel.filename, kernel.inductor_meta = list(results), filename, meta
    kernel.recheck_autotune_cache(lambda: pytest.fail("the kept config was compiled: nothing to reload"))
    assert kernel.compile_results == [results[1]]
    return kernel.compile_results[0].config, configs[1]


@pytest.mark.compat
def test_a_kernel_loaded_warm_keeps_the_mark_of_coordinate_descent(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the mark, the kernel's first run tunes it again (torch 2.11 dropped it: a warm max-autotune
    test on an H200 benchmarked and wrote a result; torch 2.13 keeps it, and the plugin adds nothing)."""
    kept, expected = _reloaded(tmp_path, monkeypatch, found_by_coordesc=True)
    assert kept is expected and getattr(kept, "found_by_coordesc", False) is True


@pytest.mark.compat
def test_the_mark_is_kept_where_torch_drops_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """torch 2.11's ``recheck_autotune_cache`` keeps the named config without the mark; here that is torch's
    own recheck followed by taking the mark off, as 2.11 leaves it. The plugin's wrapper puts it back."""
    from torch._inductor.runtime import triton_heuristics

    _skip_without_recheck()
    torch_recheck = inspect.unwrap(triton_heuristics.CachingAutotuner.recheck_autotune_cache)

    def as_in_torch_2_11(self: object, *args: object, **kwargs: object) -> None:
        torch_recheck(self, *args, **kwargs)
        for compiled in getattr(self, "compile_results", []):
            compiled.config.found_by_coordesc = False

    kept, expected = _reloaded(tmp_path, monkeypatch, found_by_coordesc=True, torch_recheck=as_in_torch_2_11)
    assert kept is expected and getattr(kept, "found_by_coordesc", False) is True


@pytest.mark.compat
def test_a_result_coordinate_descent_did_not_find_gets_no_mark(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A result of plain autotuning, with coordinate descent on: torch tunes it further, as it should."""
    kept, _ = _reloaded(tmp_path, monkeypatch, found_by_coordesc=False)
    assert not getattr(kept, "found_by_coordesc", False)

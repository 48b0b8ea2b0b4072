"""Probe: where a warm max-autotune MLP compile spends its time, bundle vs local folder."""
import cProfile, io, os, pstats, shutil, sys, tempfile, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).parents[1] / "gpu_models"))
mode, blob = sys.argv[1], Path(sys.argv[2])
root = Path(tempfile.mkdtemp())
from pytest_compilecache import _torchapi
from pytest_compilecache.cache import CompileCache
_torchapi.bootstrap(str(root / "process"))
import torch, models
if mode == "save":
    with CompileCache(root / "a", root / "process", root / "h") as c:
        models.compile_and_run("mlp_max_autotune")
    saved = _torchapi.save_artifacts().data
    assert saved is not None, "the compile recorded nothing"
    blob.write_bytes(saved)
    shutil.copytree(root / "a", str(blob) + ".dir")
    sys.exit()
test = root / "test"
if mode == "bundle":
    _torchapi.load_artifacts(blob.read_bytes(), str(test))
else:
    shutil.copytree(str(blob) + ".dir", test)
with CompileCache(root / "warmup", root / "process", root / "h"):
    models.warm_up_process()
before = set(p.relative_to(test) for p in test.rglob("*"))
with CompileCache(test, root / "process", root / "h") as c:
    prof = cProfile.Profile()
    prof.enable()
    s = models.compile_and_run("mlp_max_autotune")
    prof.disable()
    print(mode, "seconds", round(s, 3))
    print(c.stats.table())
after = set(p.relative_to(test) for p in test.rglob("*"))
print("new files", len(after - before), sorted(str(p) for p in after - before)[:12])
out = io.StringIO()
pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(25)
print("\n".join(out.getvalue().splitlines()[:45]))

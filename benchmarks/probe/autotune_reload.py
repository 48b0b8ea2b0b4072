"""Probe: where autotune lookups go after a Mega-Cache reload, with torch's API and through the plugin."""
import json, os, shutil, sys, tempfile
from pathlib import Path
sys.path.insert(0, str(Path(__file__).parents[1] / "gpu_models"))
mode, blob = sys.argv[1], Path(sys.argv[2])
root = Path(tempfile.mkdtemp())
if mode == "plugin":
    from pytest_compilecache import _torchapi
    from pytest_compilecache.cache import CompileCache
    _torchapi.bootstrap(str(root / "process"))
else:
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(root / "dir")
import torch
import models
from torch._inductor.runtime import autotune_cache as ac
seen = []
orig = ac._LocalAutotuneCacheBackend._get
def _get(self, key):
    r = orig(self, key)
    seen.append((key, r is not None))
    return r
ac._LocalAutotuneCacheBackend._get = _get
if mode == "save":
    models.compile_and_run("resnet18")
    data, info = torch.compiler.save_cache_artifacts()
    blob.write_bytes(data)
    print("saved autotune keys", list(info.artifacts.get("autotune", []))[:3], len(info.artifacts.get("autotune", [])))
    print("files", [str(p.relative_to(root / "dir")) for p in (root / "dir").rglob("*.best_config")][:3])
elif mode == "api":
    info = torch.compiler.load_cache_artifacts(blob.read_bytes())
    print("loaded", {k: len(v) for k, v in info.artifacts.items()})
    models.compile_and_run("resnet18")
elif mode == "plugin":
    template = root / "template"
    print("loaded", _torchapi.load_artifacts(blob.read_bytes(), str(template)))
    print("template files", [str(p.relative_to(template)) for p in template.rglob("*.best_config")][:3])
    test = root / "test"
    shutil.copytree(template, test)
    with CompileCache(test, root / "process", root / "headers", "warm") as c:
        models.compile_and_run("resnet18")
        print(c.stats.table())
    print("test env during:", test)
hits = sum(h for _, h in seen)
print(mode, "lookups", len(seen), "hits", hits)
for key, hit in seen[:4]:
    print("  ", hit, key)

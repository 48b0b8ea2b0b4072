"""Cache-key collision test: mod_a.f and mod_b.f share __qualname__ 'f' and co_firstlineno 4.
usage: collide.py STEP   (env TORCHINDUCTOR_CACHE_DIR set by caller, TORCH_CACHING_PRECOMPILE=1)
STEP=save_a : compile+call mod_a.f, save_cache_artifacts (writes <cache>/dynamo/<key>/entry)
STEP=run_b  : fresh process, compile+call mod_b.f, compare with eager mod_b.f
"""
import os, sys, json, traceback
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch, torch._dynamo
from torch._dynamo.utils import counters
from torch._dynamo.package import CompilePackage
import mod_a, mod_b
step = sys.argv[1]
print("caching_precompile", torch._dynamo.config.caching_precompile)
print("source ids equal:", CompilePackage.source_id_from_fn(mod_a.f) == CompilePackage.source_id_from_fn(mod_b.f))
x = torch.linspace(0, 1, 8)
try:
    if step == "save_a":
        y = torch.compile(mod_a.f)(x)
        print("a matches eager:", torch.allclose(y, mod_a.f(x)))
        r = torch.compiler.save_cache_artifacts()
        print("saved", dict(r[1].artifacts))
    else:
        y = torch.compile(mod_b.f)(x)
        print("b compiled:", y.tolist())
        print("b eager   :", mod_b.f(x).tolist())
        print("a eager   :", mod_a.f(x).tolist())
        print("b matches eager b:", torch.allclose(y, mod_b.f(x)), " matches eager a:", torch.allclose(y, mod_a.f(x)))
except Exception:
    traceback.print_exc()
print("counters", json.dumps({k: dict(v) for k, v in counters.items() if k in ("dynamo_cache", "stats", "frames")}))

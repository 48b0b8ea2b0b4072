"""In-process: what does torch._dynamo.reset() do to caching_precompile state?
env: TORCHINDUCTOR_CACHE_DIR (fresh), TORCH_CACHING_PRECOMPILE=1"""
import os, sys, time
import torch, torch._dynamo
import torch._dynamo.convert_frame as cf
from torch._dynamo.utils import counters
from torch._dynamo.precompile_context import PrecompileContext
from torch._C._dynamo.eval_frame import _debug_get_precompile_entries
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model_def
n = [0]; _o = cf._compile
def _c(*a, **k):
    n[0] += 1; return _o(*a, **k)
cf._compile = _c
x = model_def.make_input()
dyn = os.path.join(os.environ["TORCHINDUCTOR_CACHE_DIR"], "dynamo")
def state(tag):
    print(f"[{tag}] traces={n[0]} dynamo_cache={dict(counters['dynamo_cache'])} "
          f"PrecompileContext: dynamo_entries={len(PrecompileContext._dynamo_cache_entries)} backend_artifacts={len(PrecompileContext._backend_artifacts_by_key)} "
          f"precompile_entries_on_code={len(_debug_get_precompile_entries(model_def.fn.__code__))} dynamo_dir={os.listdir(dyn) if os.path.isdir(dyn) else None}")
with torch.no_grad():
    state("start")
    torch.compile(model_def.fn)(x); state("after compile #1")
    torch._dynamo.reset(); state("after reset (nothing saved yet)")
    t=time.perf_counter(); torch.compile(model_def.fn)(x); print(" compile #2 took", round(time.perf_counter()-t,3)); state("after compile #2")
    torch.compiler.save_cache_artifacts(); state("after save_cache_artifacts")
    torch._dynamo.reset(); state("after reset #2")
    t=time.perf_counter(); c3 = torch.compile(model_def.fn); c3(x); print(" compile #3 took", round(time.perf_counter()-t,3)); state("after compile #3 (dynamo dir exists)")
    ok = torch.allclose(c3(x), model_def.fn(x)); print(" #3 matches eager:", ok)
    torch._dynamo.reset(); state("after reset #3")
    t=time.perf_counter(); c3(x); print(" calling OLD wrapper c3 after reset took", round(time.perf_counter()-t,3)); state("after old-wrapper call")
    PrecompileContext.clear(); state("after PrecompileContext.clear()")

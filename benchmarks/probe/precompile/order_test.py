"""Does the Mega-Cache have to be loaded BEFORE torch.compile(fn) is called? And does setting the flag only
after torch.compile() work? usage: order_test.py MEGA_BIN CASE ; env TORCHINDUCTOR_CACHE_DIR fresh.
CASE=compile_then_load : TORCH_CACHING_PRECOMPILE=1 at start; c=torch.compile(fn); load_cache_artifacts; c(x)
CASE=flag_after_compile: flag off; c=torch.compile(fn); flag on; load; c(x)
CASE=load_then_compile_flag_late: flag off; load; c=torch.compile(fn); flag on; c(x)   (flag read at compile() time?)"""
import os, sys
case = sys.argv[2]
if case == "compile_then_load":
    os.environ["TORCH_CACHING_PRECOMPILE"] = "1"
import torch, torch._dynamo
import torch._dynamo.convert_frame as cf
from torch._dynamo.utils import counters
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model_def
n = [0]; _o = cf._compile
def _c(*a, **k):
    n[0] += 1; return _o(*a, **k)
cf._compile = _c
data = open(sys.argv[1], "rb").read()
x = model_def.make_input()
with torch.no_grad():
    if case == "compile_then_load":
        c = torch.compile(model_def.fn); torch.compiler.load_cache_artifacts(data)
    elif case == "flag_after_compile":
        c = torch.compile(model_def.fn); torch._dynamo.config.caching_precompile = True; torch.compiler.load_cache_artifacts(data)
    else:
        torch.compiler.load_cache_artifacts(data); c = torch.compile(model_def.fn); torch._dynamo.config.caching_precompile = True
    y = c(x)
print(case, "traces:", n[0], "dynamo_cache:", dict(counters["dynamo_cache"]), "matches eager:", torch.allclose(y, model_def.fn(x)))

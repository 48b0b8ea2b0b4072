"""In-process: after a DynamoCache hit installs entries on fn.__code__, do torch._dynamo.reset() + a switch to an
EMPTY TORCHINDUCTOR_CACHE_DIR give a real cold compile? env: TORCHINDUCTOR_CACHE_DIR=<dir with dynamo entry>,
TORCH_CACHING_PRECOMPILE=1. argv[1]: empty dir to switch to."""
import os, sys, time
import torch, torch._dynamo
import torch._dynamo.convert_frame as cf
from torch._dynamo.utils import counters
from torch._C._dynamo.eval_frame import _debug_get_precompile_entries, _reset_precompile_entries
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model_def
n = [0]; _o = cf._compile
def _c(*a, **k):
    n[0] += 1; return _o(*a, **k)
cf._compile = _c
x = model_def.make_input()
def st(tag):
    print(f"[{tag}] traces={n[0]} dynamo_cache={dict(counters['dynamo_cache'])} entries_on_code={len(_debug_get_precompile_entries(model_def.fn.__code__))} fxgraph={dict(counters['inductor'])}")
with torch.no_grad():
    torch.compile(model_def.fn)(x); st("compile in warm dir")
    torch._dynamo.reset()
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = sys.argv[1]
    torch.compile(model_def.fn)(x); st("after reset + switch to EMPTY dir + new torch.compile")
    _reset_precompile_entries(model_def.fn.__code__); torch._dynamo.reset()
    torch.compile(model_def.fn)(x); st("after _reset_precompile_entries(fn.__code__) + reset + new torch.compile")

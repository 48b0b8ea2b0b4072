"""Same module NAME 'mod' (va/mod.py: sin+1, vb/mod.py: cos-1), same qualname+line; simulates a test file edited
between runs (or two rootdir-less test files with the same basename). usage: collide2.py va|vb"""
import os, sys, json, traceback
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), sys.argv[1]))
import torch
from torch._dynamo.utils import counters
import mod
x = torch.linspace(0, 1, 8)
try:
    y = torch.compile(mod.f)(x)
    print(sys.argv[1], "compiled matches eager of this file:", torch.allclose(y, mod.f(x)))
    if sys.argv[1] == "va":
        torch.compiler.save_cache_artifacts()
except Exception:
    traceback.print_exc()
print("counters", json.dumps({k: dict(v) for k, v in counters.items() if k in ("dynamo_cache", "stats")}))

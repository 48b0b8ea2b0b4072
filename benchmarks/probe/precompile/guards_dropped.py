"""In-process: does caching_precompile drop guards that would otherwise trigger a recompile?
usage: guards_dropped.py PRE(0|1)"""
import os, sys
if sys.argv[1] == "1":
    os.environ["TORCH_CACHING_PRECOMPILE"] = "1"
import torch, torch._dynamo
from torch._dynamo.utils import counters
print("caching_precompile", torch._dynamo.config.caching_precompile)

helper = torch.sin

def f(x):
    return helper(x) * 2

x = torch.linspace(0, 1, 8)
cf = torch.compile(f, backend="eager")  # backend irrelevant for guards; eager keeps it fast
print("1st  (helper=sin) correct:", torch.allclose(cf(x), torch.sin(x) * 2))
helper = torch.cos
y = cf(x)
print("2nd  (helper=cos) correct:", torch.allclose(y, torch.cos(x) * 2), "| equals stale sin result:", torch.allclose(y, torch.sin(x) * 2))
print("unique_graphs:", counters["stats"]["unique_graphs"])

# module swap: global model replaced by a different instance with different weights
torch.manual_seed(0)
M = torch.nn.Linear(4, 4)
def g(x):
    return M(x)
cg = torch.compile(g, backend="eager")
z = torch.ones(2, 4)
with torch.no_grad():
    print("model 1 correct:", torch.allclose(cg(z), M(z)))
    M = torch.nn.Linear(4, 4)
    print("model 2 (new instance) correct:", torch.allclose(cg(z), M(z)))
    M.weight.fill_(0.5)
    print("model 2 weights mutated in place correct:", torch.allclose(cg(z), M(z)))
print("unique_graphs:", counters["stats"]["unique_graphs"])

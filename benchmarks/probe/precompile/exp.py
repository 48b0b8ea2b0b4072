"""One process of an experiment.
usage: exp.py ROLE(A|B) KIND(fn|module) TRAIN(0|1) PRECOMPILE(0|1) MEGACACHE_PATH_OR_- LOAD(0|1) OUT_JSON
Env TORCHINDUCTOR_CACHE_DIR must be set by caller.
"""
import json, os, sys, time, traceback, warnings, logging, io
role, kind, train, pre, mc_path, load, out = sys.argv[1:8]
train = train == "1"; pre = pre == "1"; load = load == "1"
if pre:
    os.environ["TORCH_CACHING_PRECOMPILE"] = "1"
t_import0 = time.perf_counter()
import torch
import torch._dynamo
import torch._dynamo.convert_frame as cf
t_import = time.perf_counter() - t_import0
torch._dynamo.config.caching_precompile = pre

# capture warnings / log records from torch
log_buf = io.StringIO()
h = logging.StreamHandler(log_buf); h.setLevel(logging.WARNING)
logging.getLogger("torch").addHandler(h)
warnings.simplefilter("always"); warnings.filterwarnings("ignore", message=".*torch.jit.script_method.*")
caught = []
warnings.showwarning = lambda m, c, f, l, *a, **k: caught.append(f"{c.__name__}: {m} ({f}:{l})")

# count Dynamo tracing: every call of convert_frame._compile is a trace attempt
n_compile = [0]
_orig = cf._compile
def _counting(*a, **k):
    n_compile[0] += 1
    return _orig(*a, **k)
cf._compile = _counting

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model_def
from torch._dynamo.utils import counters

res = {"role": role, "kind": kind, "train": train, "precompile": pre, "load": load,
       "torch": torch.__version__, "cache_dir": os.environ.get("TORCHINDUCTOR_CACHE_DIR"),
       "config.caching_precompile": torch._dynamo.config.caching_precompile,
       "t_import": t_import}
err = None
try:
    if load:
        t0 = time.perf_counter()
        with open(mc_path, "rb") as f:
            data = f.read()
        info = torch.compiler.load_cache_artifacts(data)
        res["t_load"] = time.perf_counter() - t0
        res["load_info"] = {k: len(v) for k, v in info.artifacts.items()} if info else None
        res["load_info_precompile_keys"] = list(info.precompile_artifacts) if info else None
    x = model_def.make_input()
    target = model_def.MODEL if kind == "module" else model_def.fn
    # eager reference
    if train:
        xr = x.clone().requires_grad_(True)
        out_e = target(xr); out_e.sum().backward()
        ref = (out_e.detach().clone(), xr.grad.clone(), [p.grad.clone() for p in model_def.MODEL.parameters()])
        model_def.MODEL.zero_grad(set_to_none=True)
    else:
        with torch.no_grad():
            ref = (target(x).clone(),)
    t0 = time.perf_counter()
    c = torch.compile(target)
    if train:
        xc = x.clone().requires_grad_(True)
        out_c = c(xc); out_c.sum().backward()
    else:
        with torch.no_grad():
            out_c = c(x)
    res["t_first_call"] = time.perf_counter() - t0
    # second call timing (steady state)
    t0 = time.perf_counter()
    if train:
        xc2 = x.clone().requires_grad_(True); c(xc2).sum().backward()
    else:
        with torch.no_grad():
            c(x)
    res["t_second_call"] = time.perf_counter() - t0
    if train:
        ok = torch.allclose(out_c, ref[0], atol=1e-5) and torch.allclose(xc.grad, ref[1], atol=1e-5)
        pg = [p.grad for p in model_def.MODEL.parameters()]
        # param grads were accumulated over 2 compiled calls -> compare 2*ref
        ok = ok and all(torch.allclose(a, 2 * b, atol=1e-5) for a, b in zip(pg, ref[2]))
    else:
        ok = torch.allclose(out_c, ref[0], atol=1e-5)
    res["matches_eager"] = bool(ok)
    if role == "A" and os.environ.get("EXP_NOSAVE") != "1":
        t0 = time.perf_counter()
        r = torch.compiler.save_cache_artifacts()
        res["t_save"] = time.perf_counter() - t0
        if r is not None:
            data, info = r
            with open(mc_path, "wb") as f:
                f.write(data)
            res["save_bytes"] = len(data)
            res["save_info"] = {k: len(v) for k, v in info.artifacts.items()}
            res["save_info_precompile_keys"] = list(info.precompile_artifacts)
        else:
            res["save_info"] = None
except Exception:
    err = traceback.format_exc()
res["error"] = err
res["n_convert_frame_compile_calls"] = n_compile[0]
res["counters"] = {k: dict(v) for k, v in counters.items() if v}
res["warnings"] = caught
res["torch_log_warnings"] = log_buf.getvalue()
try:
    res["compile_times"] = torch._dynamo.utils.compile_times(repr="csv", aggregate=True)
except Exception as e:
    res["compile_times"] = repr(e)
dyn = os.path.join(os.environ["TORCHINDUCTOR_CACHE_DIR"], "dynamo")
res["dynamo_dir_entries"] = sorted(os.listdir(dyn)) if os.path.isdir(dyn) else None
with open(out, "w") as f:
    json.dump(res, f, indent=1, default=str)
print(json.dumps({k: res[k] for k in ("role","kind","train","precompile","load") }), "t_first", res.get("t_first_call"), "err", bool(err))

"""Runs experiments 1-3. usage: driver.py PYTHON TAG [configs...]
config = kind:train:pre  e.g. fn:0:1
Writes results/<TAG>/... json files and a summary results/<TAG>/summary.json
"""
import json, os, shutil, subprocess, sys, statistics
PY, TAG = sys.argv[1], sys.argv[2]
configs = sys.argv[3:] or ["fn:0:0", "fn:0:1", "module:0:0", "module:0:1", "fn:1:0", "fn:1:1", "module:1:0", "module:1:1"]
modes = os.environ.get("MODES", "mc,mcbin,warm").split(",")
REPS = int(os.environ.get("REPS", "3"))
HERE = os.path.dirname(os.path.abspath(__file__))
R = os.path.join(HERE, "results", TAG)
os.makedirs(R, exist_ok=True)

def run(role, kind, train, pre, mc, load, out, cache_dir, extra_env=None):
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache_dir)
    env.pop("TORCH_CACHING_PRECOMPILE", None)
    env.update(extra_env or {})
    p = subprocess.run([PY, os.path.join(HERE, "exp.py"), role, kind, train, pre, mc, load, out],
                       env=env, capture_output=True, text=True)
    with open(out + ".stderr", "w") as f:
        f.write(p.stderr)
    with open(out + ".stdout", "w") as f:
        f.write(p.stdout)
    d = json.load(open(out))
    d["returncode"] = p.returncode
    return d

def copy_bins(src, dst):
    os.makedirs(dst, exist_ok=True)
    for e in os.listdir(src):
        if len(e) == 2 and os.path.isdir(os.path.join(src, e)):
            shutil.copytree(os.path.join(src, e), os.path.join(dst, e))

summary = {}
for cfg in configs:
    kind, train, pre = cfg.split(":")
    name = f"{kind}_train{train}_pre{pre}"
    base = os.path.join(R, name); shutil.rmtree(base, ignore_errors=True); os.makedirs(base)
    dirA = os.path.join(base, "dirA"); mc = os.path.join(base, "mega.bin")
    a = run("A", kind, train, pre, mc, "0", os.path.join(base, "A.json"), dirA)
    summary[name] = {"A": {k: a.get(k) for k in ("t_first_call", "save_info", "save_bytes", "n_convert_frame_compile_calls", "matches_eager", "error")}}
    print(name, "A", a["t_first_call"] if "t_first_call" in a else a["error"], flush=True)
    for mode in modes:
        rs = []
        for i in range(REPS):
            d = os.path.join(base, f"dir_{mode}{i}")
            if mode == "warm":
                shutil.copytree(dirA, d)
            elif mode == "mcbin":
                copy_bins(dirA, d)
            out = os.path.join(base, f"B_{mode}{i}.json")
            rs.append(run("B", kind, train, pre, mc, "1" if mode.startswith("mc") else "0", out, d))
        ts = [r.get("t_first_call") for r in rs]
        summary[name][mode] = {
            "t_first_call_all": ts,
            "t_first_call_median": statistics.median(ts) if None not in ts else None,
            "t_load_median": statistics.median([r["t_load"] for r in rs]) if "t_load" in rs[0] else None,
            "n_convert_frame_compile_calls": [r["n_convert_frame_compile_calls"] for r in rs],
            "matches_eager": [r.get("matches_eager") for r in rs],
            "errors": [r["error"] for r in rs if r["error"]],
            "counters_rep0": rs[0]["counters"],
            "compile_times_rep0": rs[0]["compile_times"],
            "load_info": rs[0].get("load_info"),
        }
        print(name, mode, ts, summary[name][mode]["n_convert_frame_compile_calls"], flush=True)
    json.dump(summary, open(os.path.join(R, "summary.json"), "w"), indent=1)

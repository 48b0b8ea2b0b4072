"""Issue 22 ("moonshot"): can torch's AOT precompile API skip Dynamo's work for a
warm resnet18, and is it safe?

Candidate API (torch 2.11: needs torch._dynamo.config.enable_aot_compile = True
before torch.compile is called):
    aot = torch.compile(model.forward, fullgraph=True).aot_compile(((x,), {}))
    aot.save_compiled_function(path)
    # new process:
    fn = torch.compiler.load_compiled_function(open(path, "rb"))
    y = fn(model, x)

Each step runs in a new subprocess of this script (``--child STEP``) with its own
TORCHINDUCTOR_CACHE_DIR / TRITON_CACHE_DIR:
  build      cold torch.compile (compile + first call) into the kept folder, then
             aot_compile + save_compiled_function (also for two small probes that
             read a module global), eager and compiled reference outputs
  eager      first forward call in eager mode
  warm       torch.compile from the kept folder: compile + first call
  aot_kept   load_compiled_function + first call, kept cache dirs
  aot_fresh  load_compiled_function + first call, new empty cache dirs
  safety     guards (batch size, dtype, train mode, grad mode, other weights,
             memory format), torch._dynamo.reset(), Dynamo counters and code
             caches, module globals, coexistence with a plain torch.compile,
             stale module globals (the probes, loaded with changed globals); a variant
             artifact built with guard_filter_fn=keep_serializable_guards (global
             guards kept)
  cold       a repeat of the cold torch.compile into a new empty folder
             (only while the time budget allows)
All forward calls run under torch.no_grad(), as the project's other benchmarks do.

usage: aot_resnet.py [--device cuda] [--model resnet18|tiny] [--reps 3]
                     [--budget 530] [--out DIR] [--work DIR] [--steps LIST]
                     [--preimport] [--pycache DIR]
Writes DIR/moonshot.log (the table and every run), DIR/results.json and
DIR/guards.txt.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

T_PROC = time.perf_counter()
import torch  # noqa: E402  (module level: TinyNet below needs it; the parent imports it too)

T_IMPORT_TORCH = time.perf_counter() - T_PROC
HERE = os.path.dirname(os.path.abspath(__file__))
TIMED = ["eager", "warm", "aot_kept", "aot_fresh"]

# Two tiny functions that read module globals: the AOT artifact is built with the
# defaults below and loaded by the safety step with AOT_PROBE_SCALE=3 and
# AOT_PROBE_BIAS=5; a fresh compile in that process would use 3 and 5.
_SCALE = float(os.environ.get("AOT_PROBE_SCALE", "2.0"))
_BIAS_VAL = float(os.environ.get("AOT_PROBE_BIAS", "1.0"))
_BIAS = None  # a tensor, set by _init_probe_globals once torch is imported


def probe_scale(x):
    return x * _SCALE


def probe_bias(x):
    return x + _BIAS


# ----------------------------------------------------------------- child side

def keep_serializable_guards(entries):
    """guard_filter_fn for a variant artifact: keep global guards too (the default
    filter of aot_compile drops them), drop only the guard types that
    torch cannot serialize."""
    from torch._dynamo.guards import CheckFunctionManager
    bad = CheckFunctionManager.UNSUPPORTED_SERIALIZATION_GUARD_TYPES
    return [not (e.guard_type in bad or any(t in bad for t in (e.derived_guard_types or ())))
            for e in entries]


def _init_probe_globals(torch, dev):
    global _BIAS
    _BIAS = torch.full((16,), _BIAS_VAL, device=dev)


class TinyNet(torch.nn.Module):
    """A small stand-in for resnet18 in CPU dry runs (defined at module level:
    the AOT guards refuse classes defined in a local scope)."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.fc = torch.nn.Linear(8, 10)

    def forward(self, x):
        x = torch.relu(self.bn(self.conv(x)))
        return self.fc(torch.flatten(torch.nn.functional.adaptive_avg_pool2d(x, 1), 1))


def _make_model(torch, name, dev, seed=0):
    torch.manual_seed(seed)
    if name == "resnet18":
        import torchvision
        m = torchvision.models.resnet18()
    else:
        m = TinyNet()
    return m.eval().to(dev)


def _make_input(torch, a, dev):
    g = torch.Generator().manual_seed(1)
    return torch.randn(a.batch, 3, a.size, a.size, generator=g).to(dev)


def _counters():
    from torch._dynamo.utils import counters
    return {k: dict(v) for k, v in counters.items() if v}


def _cmp(torch, got, want, tol):
    got, want = got.detach().float().cpu(), want.detach().float().cpu()
    if got.shape != want.shape:
        return {"equal": False, "detail": f"shape {tuple(got.shape)} vs {tuple(want.shape)}"}
    d = (got - want).abs().max().item()
    return {"equal": bool(torch.allclose(got, want, rtol=tol, atol=tol)), "max_abs_diff": d}


def _err(e):
    return f"{type(e).__name__}: {str(e).strip()[:400]}"


def child(a):
    t_import = T_IMPORT_TORCH
    dev = torch.device(a.device)
    cuda = dev.type == "cuda"

    def sync():
        if cuda:
            torch.cuda.synchronize()

    art = os.path.join(a.work, "artifacts")
    os.makedirs(art, exist_ok=True)
    tol = a.tol
    r = {"step": a.child, "t_import_torch": t_import}
    if a.model == "resnet18":
        t1 = time.perf_counter()
        import torchvision  # noqa: F401  (timed apart from model construction)
        r["t_import_torchvision"] = time.perf_counter() - t1
    if a.child == "build":
        r["versions"] = {"torch": torch.__version__, "cuda": torch.version.cuda,
                         "python": sys.version.split()[0]}
        try:
            import triton
            r["versions"]["triton"] = triton.__version__
        except Exception:
            pass
        if cuda:
            r["versions"]["card"] = torch.cuda.get_device_name()
        r["enable_aot_compile_default"] = torch._dynamo.config.enable_aot_compile

    if a.preimport:  # as in a test session where an earlier test already compiled something
        t1 = time.perf_counter()
        import importlib
        for m in ("torch._dynamo.aot_compile", "torch._inductor.codecache",
                  "torch._inductor.compile_fx", "torch._inductor.runtime.triton_heuristics"):
            importlib.import_module(m)
        r["t_preimport"] = time.perf_counter() - t1

    t1 = time.perf_counter()
    model = _make_model(torch, a.model, dev)
    x = _make_input(torch, a, dev)
    sync()
    r["t_model"] = time.perf_counter() - t1

    with torch.no_grad():
        if a.child == "eager":
            t1 = time.perf_counter()
            y = model(x)
            sync()
            r["t_first"] = time.perf_counter() - t1
            t1 = time.perf_counter()
            model(x)
            sync()
            r["t_second"] = time.perf_counter() - t1
            r["vs_eager_ref"] = _cmp(torch, y, torch.load(os.path.join(art, "ref_eager.pt")), tol)

        elif a.child in ("build", "cold", "warm"):
            t1 = time.perf_counter()
            cm = torch.compile(model)
            y = cm(x)
            sync()
            r["t_first"] = time.perf_counter() - t1
            t1 = time.perf_counter()
            cm(x)
            sync()
            r["t_second"] = time.perf_counter() - t1
            r["counters"] = _counters()
            if a.child == "build":
                y_eager = model(x)
                torch.save(y_eager.cpu(), os.path.join(art, "ref_eager.pt"))
                torch.save(y.cpu(), os.path.join(art, "ref_compiled.pt"))
                r["compiled_vs_eager"] = _cmp(torch, y, y_eager, tol)
                _build_aot(torch, a, r, model, x, dev, sync, art, y_eager, tol)
            else:
                r["vs_eager_ref"] = _cmp(torch, y, torch.load(os.path.join(art, "ref_eager.pt")), tol)
                r["vs_compiled_ref"] = _cmp(torch, y, torch.load(os.path.join(art, "ref_compiled.pt")), tol)

        elif a.child == "aot":
            prof = None
            if os.environ.get("AOT_PROFILE"):  # an extra, untimed run: where the load's time goes
                import cProfile
                prof = cProfile.Profile()
                prof.enable()
            t1 = time.perf_counter()
            with open(os.path.join(art, "model.aot"), "rb") as f:
                fn = torch.compiler.load_compiled_function(f)
            r["t_load"] = time.perf_counter() - t1
            t2 = time.perf_counter()
            y = fn(model, x)
            sync()
            r["t_call"] = time.perf_counter() - t2
            r["t_first"] = time.perf_counter() - t1  # load + first call
            if prof is not None:
                import io
                import pstats
                prof.disable()
                buf = io.StringIO()
                pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(35)
                r["profile"] = buf.getvalue()[-9000:]
            t1 = time.perf_counter()
            fn(model, x)
            sync()
            r["t_second"] = time.perf_counter() - t1
            r["counters"] = _counters()
            r["vs_eager_ref"] = _cmp(torch, y, torch.load(os.path.join(art, "ref_eager.pt")), tol)
            r["vs_compiled_ref"] = _cmp(torch, y, torch.load(os.path.join(art, "ref_compiled.pt")), tol)

        elif a.child == "safety":
            _safety(torch, a, r, model, x, dev, sync, art, tol)

    r["t_process_to_end"] = time.perf_counter() - T_PROC
    with open(a.result, "w") as f:
        json.dump(r, f, indent=1, default=str)


def _guards_text(fn):
    try:
        return str(fn._artifacts.guard_manager)
    except Exception as e:  # pragma: no cover
        return f"(could not print guards: {_err(e)})"


def _build_aot(torch, a, r, model, x, dev, sync, art, y_eager, tol):
    import __main__
    before = set(vars(__main__))
    torch._dynamo.config.enable_aot_compile = True  # 2.11: off by default; gates .aot_compile
    guards = []
    try:
        t1 = time.perf_counter()
        aot = torch.compile(model.forward, fullgraph=True).aot_compile(((x,), {}))
        y = aot(model, x)
        sync()
        r["t_aot_compile_and_call"] = time.perf_counter() - t1
        t1 = time.perf_counter()
        aot.save_compiled_function(os.path.join(art, "model.aot"))
        r["t_aot_save"] = time.perf_counter() - t1
        r["aot_bytes"] = os.path.getsize(os.path.join(art, "model.aot"))
        r["aot_vs_eager"] = _cmp(torch, y, y_eager, tol)
        guards.append(("model.forward", _guards_text(aot)))
    except Exception as e:
        import traceback
        r["aot_error"] = _err(e)
        r["aot_traceback"] = traceback.format_exc()[-3000:]
    # variant: the same artifact built with global guards kept (see keep_serializable_guards)
    try:
        t1 = time.perf_counter()
        kg = torch.compile(model.forward, fullgraph=True,
                           options={"guard_filter_fn": keep_serializable_guards}).aot_compile(((x,), {}))
        kg.save_compiled_function(os.path.join(art, "model_kg.aot"))
        r["t_aot_kg_compile_and_save"] = time.perf_counter() - t1
        guards.append(("model.forward, global guards kept", _guards_text(kg)))
    except Exception as e:
        r["aot_kg_error"] = _err(e)
    _init_probe_globals(torch, dev)
    xs = torch.arange(16.0, device=dev)
    for name, f, opts in (("probe_scale", probe_scale, {}), ("probe_bias", probe_bias, {}),
                          ("probe_scale_kg", probe_scale, {"guard_filter_fn": keep_serializable_guards})):
        try:
            p = torch.compile(f, fullgraph=True, options=opts).aot_compile(((xs,), {}))
            r[f"{name}_built_value"] = p(xs)[:3].tolist()
            p.save_compiled_function(os.path.join(art, f"{name}.aot"))
            guards.append((name, _guards_text(p)))
        except Exception as e:
            r[f"{name}_error"] = _err(e)
    r["main_globals_added_by_build"] = sorted(set(vars(__main__)) - before)
    with open(os.path.join(art, "guards.txt"), "w") as f:
        for name, text in guards:
            f.write(f"==== guards kept in the saved artifact for {name} ====\n{text}\n\n")


def _safety(torch, a, r, model, x, dev, sync, art, tol):
    import copy

    import __main__
    checks = {}
    r["checks"] = checks
    code = type(model).forward.__code__

    def code_state():
        out = {}
        try:
            out["cache_entries_on_forward"] = len(torch._dynamo.eval_frame._debug_get_cache_entry_list(code))
        except Exception as e:
            out["cache_entries_on_forward"] = _err(e)
        try:
            from torch._C._dynamo.eval_frame import _debug_get_precompile_entries
            out["precompile_entries_on_forward"] = len(_debug_get_precompile_entries(code))
        except Exception as e:
            out["precompile_entries_on_forward"] = _err(e)
        return out

    def check(name, got_fn, want_fn, note=""):
        """Call the loaded function and what a fresh run would do; record what happened."""
        res = {}
        try:
            got = got_fn()
            sync()
        except Exception as e:
            got, res["loaded"] = None, "raised " + _err(e)
        try:
            want = want_fn()
            sync()
        except Exception as e:
            want, res["reference"] = None, "raised " + _err(e)
        if got is not None and want is not None:
            c = _cmp(torch, got, want, tol)
            res.update(c)
            res["outcome"] = "returned, equals reference" if c["equal"] else "RETURNED A DIFFERENT RESULT (silent)"
        elif got is None and want is None:
            res["outcome"] = "raised (reference raises too)"
        elif got is None:
            res["outcome"] = "raised (loud)"
        else:
            res["outcome"] = "RETURNED where the reference raises"
        if note:
            res["note"] = note
        checks[name] = res

    main_before = set(vars(__main__))
    resnet_mod = sys.modules[type(model).__module__]
    mod_before = set(vars(resnet_mod))
    r["code_state_before"] = code_state()
    with open(os.path.join(art, "model.aot"), "rb") as f:
        fn = torch.compiler.load_compiled_function(f)
    check("same inputs", lambda: fn(model, x), lambda: model(x))
    r["counters_after_load_and_call"] = _counters()
    r["code_state_after_load_and_call"] = code_state()
    r["main_globals_added_by_load"] = sorted(set(vars(__main__)) - main_before)
    r["model_module_globals_added_by_load"] = sorted(set(vars(resnet_mod)) - mod_before)

    x4 = x[: max(1, a.batch // 2)].clone()
    check("smaller batch", lambda: fn(model, x4), lambda: model(x4))
    x2 = torch.cat([x, x])
    check("larger batch", lambda: fn(model, x2), lambda: model(x2))
    check("float16 input, float32 model", lambda: fn(model, x.half()), lambda: model(x.half()))
    mh = copy.deepcopy(model).half()
    check("float16 model and input", lambda: fn(mh, x.half()), lambda: mh(x.half()))
    mt1, mt2 = copy.deepcopy(model).train(), copy.deepcopy(model).train()
    check("model.train()", lambda: fn(mt1, x), lambda: mt2(x),
          "train-mode BatchNorm uses batch statistics")
    with torch.enable_grad():
        check("grad mode on (built under no_grad)", lambda: fn(model, x), lambda: model(x))
    m2 = _make_model(torch, a.model, dev, seed=1)
    check("other weights (seed 1), same class", lambda: fn(m2, x), lambda: m2(x))
    xcl = x.contiguous(memory_format=torch.channels_last)
    check("channels_last input", lambda: fn(model, xcl), lambda: model(xcl))
    if dev.type == "cuda":
        xc = x.cpu()
        mc = copy.deepcopy(model).cpu()
        check("cpu model and input", lambda: fn(mc, xc), lambda: mc(xc))

    torch._dynamo.reset()
    check("after torch._dynamo.reset()", lambda: fn(model, x), lambda: model(x),
          "the loaded object is not registered with Dynamo, so reset has nothing to clear")
    with open(os.path.join(art, "model.aot"), "rb") as f:
        fn2 = torch.compiler.load_compiled_function(f)
    check("second load of the same file in one process", lambda: fn2(model, x), lambda: fn(model, x))

    # the variant built with global guards kept
    for label, kw in (("f_globals not passed", {}), ("f_globals=the model module's globals", {"f_globals": vars(resnet_mod)})):
        name = f"global guards kept, {label}: same inputs"
        try:
            with open(os.path.join(art, "model_kg.aot"), "rb") as fh:
                pk = torch.compiler.load_compiled_function(fh, **kw)
        except Exception as e:
            checks[name] = {"outcome": "load raised " + _err(e)}
            continue
        check(name, lambda: pk(model, x), lambda: model(x))

    # coexistence with a plain torch.compile of the same model in the same process
    before = _counters()
    cm = torch.compile(model)
    check("plain torch.compile after the AOT load", lambda: cm(x), lambda: model(x))
    r["counters_plain_compile_before"] = before
    r["counters_plain_compile_after"] = _counters()
    check("loaded function after the plain compile", lambda: fn(model, x), lambda: model(x))
    r["code_state_after_plain_compile"] = code_state()

    # stale module globals: artifacts built with _SCALE=2, _BIAS=1; this process has other values
    _init_probe_globals(torch, dev)
    r["probe_globals_now"] = {"_SCALE": _SCALE, "_BIAS": _BIAS_VAL}
    xs = torch.arange(16.0, device=dev)
    torch._dynamo.reset()
    for name, f in (("probe_scale", probe_scale), ("probe_bias", probe_bias), ("probe_scale_kg", probe_scale)):
        fresh = torch.compile(f, fullgraph=True)
        for label, kw in (("f_globals not passed", {}), ("f_globals=globals()", {"f_globals": vars(__main__)})):
            try:
                with open(os.path.join(art, f"{name}.aot"), "rb") as fh:
                    p = torch.compiler.load_compiled_function(fh, **kw)
            except Exception as e:
                checks[f"{name} ({label})"] = {"outcome": "load raised " + _err(e)}
                continue
            check(f"{name} ({label})", lambda: p(xs), lambda: fresh(xs),
                  "reference = a fresh torch.compile in this process")
            for key, call in (("loaded_first_values", p), ("fresh_first_values", fresh)):
                try:
                    checks[f"{name} ({label})"][key] = call(xs)[:3].tolist()
                except Exception as e:
                    checks[f"{name} ({label})"][key] = "raised " + _err(e)[:80]
    r["main_globals_added_in_safety_step"] = sorted(set(vars(__main__)) - main_before)


# ---------------------------------------------------------------- parent side

def _fmt(vals):
    vals = [v for v in vals if v is not None]
    if not vals:
        return "-", "-", 0
    return f"{statistics.median(vals):.3f}", f"{min(vals):.3f}-{max(vals):.3f}", len(vals)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda")
    p.add_argument("--model", default="resnet18", choices=["resnet18", "tiny"])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--tol", type=float, default=1e-3)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--cold-reps", type=int, default=3)
    p.add_argument("--budget", type=float, default=530.0, help="seconds for the whole run; steps that would not fit are skipped")
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    p.add_argument("--work", default=None)
    p.add_argument("--steps", default="safety,eager,warm,aot_kept,aot_fresh,cold,profile",
                   help="which steps to run after the build (comma-separated)")
    p.add_argument("--preimport", action="store_true",
                   help="children import torch._dynamo / torch._inductor before the model and the timed call")
    p.add_argument("--pycache", default=None,
                   help="PYTHONPYCACHEPREFIX for the children (where torch's own .pyc files are missing)")
    p.add_argument("--child", default=None)
    p.add_argument("--result", default=None)
    a = p.parse_args()
    if a.child:
        return child(a)

    start = time.perf_counter()
    work = a.work or tempfile.mkdtemp(prefix="aot-resnet-")
    os.makedirs(work, exist_ok=True)
    os.makedirs(a.out, exist_ok=True)
    runs = []
    lines = []

    def say(s=""):
        print(s, flush=True)
        lines.append(s)

    def left():
        return a.budget - (time.perf_counter() - start)

    def run(step, cache, extra_env=None, child_step=None):
        res_path = os.path.join(work, f"r{len(runs):02d}-{step}.json")
        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=os.path.join(cache, "inductor"),
                   TRITON_CACHE_DIR=os.path.join(cache, "triton"), PYTHONUNBUFFERED="1")
        for k in ("TORCH_CACHING_PRECOMPILE", "TORCHINDUCTOR_FORCE_DISABLE_CACHES"):
            env.pop(k, None)
        env.update(extra_env or {})
        if a.pycache:
            env["PYTHONPYCACHEPREFIX"] = a.pycache
            env.pop("PYTHONDONTWRITEBYTECODE", None)
        cmd = [sys.executable, os.path.abspath(__file__), "--child", child_step or step,
               "--work", work, "--device", a.device, "--model", a.model, "--batch", str(a.batch),
               "--size", str(a.size), "--tol", str(a.tol), "--result", res_path]
        if a.preimport:
            cmd.append("--preimport")
        t0 = time.perf_counter()
        timeout = max(10.0, left() - 5)
        try:
            pr = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
            rc, err = pr.returncode, pr.stderr
        except subprocess.TimeoutExpired as e:
            rc, err = "timeout", (e.stderr or b"").decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        wall = time.perf_counter() - t0
        try:
            d = json.load(open(res_path))
        except Exception:
            d = {"step": step}
        d.update(step=step, rc=rc, wall=wall, cache=cache)
        if rc != 0:
            d["stderr_tail"] = err[-2500:]
        runs.append(d)
        tf = d.get("t_first")
        say(f"[{time.perf_counter() - start:6.1f}s] {step:9s} rc={rc} wall={wall:6.2f}s first={tf if tf is None else round(tf, 3)}"
            + (f" load={d['t_load']:.3f} call={d['t_call']:.3f}" if "t_load" in d else ""))
        if rc != 0:
            say("   stderr tail: " + err[-1500:].replace("\n", "\n   "))
        return d

    kept = os.path.join(work, "kept")
    build = run("build", kept)
    aot_ok = os.path.exists(os.path.join(work, "artifacts", "model.aot"))
    # safety first (untimed), so that its findings come back even if time runs short
    steps = set(a.steps.split(","))
    safety = {}
    if aot_ok and "safety" in steps:
        safety = run("safety", kept, {"AOT_PROBE_SCALE": "3.0", "AOT_PROBE_BIAS": "5.0"})
    # timed rounds, order rotated each round; the build is the first cold run
    walls = {"cold": build.get("wall") or 120}

    def need(step):
        return max(30.0, 1.3 * walls.get(step, 30.0) + 5)

    for i in range(a.reps):
        timed = [t for t in TIMED if t in steps]
        order = timed[i % len(timed):] + timed[: i % len(timed)]
        if 0 < i < a.cold_reps and "cold" in steps:
            order.insert(i, "cold")
        for step in order:
            if step.startswith("aot") and not aot_ok:
                continue
            if left() < need(step):
                say(f"skipping {step} of round {i}: {left():.0f}s left, about {need(step):.0f}s needed")
                continue
            if step == "aot_fresh":
                d = run(step, os.path.join(work, f"fresh{i}"), child_step="aot")
            elif step == "aot_kept":
                d = run(step, kept, child_step="aot")
            elif step == "cold":
                d = run(step, os.path.join(work, f"cold{i}"))
            else:
                d = run(step, kept)
            walls[step] = max(walls.get(step, 0), d["wall"])
    prof = {}
    if aot_ok and "profile" in steps and left() > need("aot_kept") + 5:
        prof = run("aot_profile", kept, {"AOT_PROFILE": "1"}, child_step="aot")

    # ---- table
    def vals(step, key="t_first"):
        rs = [r for r in runs if r["step"] == step and r.get("rc") == 0]
        if step == "cold":
            rs = [r for r in runs if r["step"] in ("build", "cold") and r.get("rc") == 0]
        return [r.get(key) for r in rs]

    v = build.get("versions", {})
    say()
    say("=" * 100)
    say(f"aot_resnet.py  model={a.model} batch={a.batch} size={a.size} device={a.device} "
        f"card={v.get('card')} torch={v.get('torch')} triton={v.get('triton')} cuda={v.get('cuda')} python={v.get('python')}")
    say(f"torch._dynamo.config.enable_aot_compile default in this torch: {build.get('enable_aot_compile_default')}")
    say(f"options: steps={a.steps} preimport={a.preimport} pycache={a.pycache} reps={a.reps} cold_reps={a.cold_reps}")
    say("seconds; each run a new process; 'first call' = after model construction and .to(device), cuda-synchronized;")
    say("for torch.compile it includes torch.compile() and the compile work; for the AOT API it includes load_compiled_function()")
    say(f"{'variant':66s} {'median':>8s} {'range':>15s} {'n':>3s}")
    e_med = None
    rows = [
        ("eager: first forward call", "eager", "t_first"),
        ("torch.compile cold (compile + first call, empty dirs)", "cold", "t_first"),
        ("torch.compile warm from the kept folder (first call)", "warm", "t_first"),
        ("AOT load_compiled_function + first call, kept dirs", "aot_kept", "t_first"),
        ("   of which load_compiled_function", "aot_kept", "t_load"),
        ("   of which first call", "aot_kept", "t_call"),
        ("AOT load_compiled_function + first call, empty dirs", "aot_fresh", "t_first"),
        ("   of which load_compiled_function", "aot_fresh", "t_load"),
        ("   of which first call", "aot_fresh", "t_call"),
        ("eager: second call", "eager", "t_second"),
        ("torch.compile warm: second call", "warm", "t_second"),
        ("AOT (kept dirs): second call", "aot_kept", "t_second"),
        ("process: import torch (eager runs)", "eager", "t_import_torch"),
        ("process: model construction + .to(device) (eager runs)", "eager", "t_model"),
        ("process: --preimport of torch._dynamo/_inductor (warm runs)", "warm", "t_preimport"),
        ("process: --preimport of torch._dynamo/_inductor (AOT kept runs)", "aot_kept", "t_preimport"),
        ("process: start to end, before exit (eager runs)", "eager", "t_process_to_end"),
        ("process: start to end, before exit (warm runs)", "warm", "t_process_to_end"),
        ("process: start to end, before exit (AOT kept runs)", "aot_kept", "t_process_to_end"),
        ("process: wall incl. interpreter exit (eager runs)", "eager", "wall"),
        ("process: wall incl. interpreter exit (warm runs)", "warm", "wall"),
        ("process: wall incl. interpreter exit (AOT kept runs)", "aot_kept", "wall"),
    ]
    for label, step, key in rows:
        med, rng, n = _fmt(vals(step, key))
        say(f"{label:66s} {med:>8s} {rng:>15s} {n:>3d}")
        if step == "eager" and key == "t_first" and n:
            e_med = float(med)
    if e_med is not None:
        for label, step in (("warm torch.compile", "warm"), ("AOT, kept dirs", "aot_kept"), ("AOT, empty dirs", "aot_fresh")):
            vs = [x for x in vals(step) if x is not None]
            if vs:
                say(f"median first call minus eager's median, {label}: {statistics.median(vs) - e_med:+.3f} s")
    say(f"build process: cold compile {build.get('t_first')}, aot_compile + call {build.get('t_aot_compile_and_call')} "
        f"(after the cold compile in the same process, so it could reuse its caches), save {build.get('t_aot_save')}, "
        f"artifact {build.get('aot_bytes')} bytes")
    if "aot_error" in build:
        say("AOT BUILD FAILED: " + build["aot_error"])
    say(f"outputs vs eager (rtol=atol={a.tol}): compiled {build.get('compiled_vs_eager')}, aot at build {build.get('aot_vs_eager')}")
    for step in ("warm", "aot_kept", "aot_fresh"):
        say(f"  {step}: vs eager {[r.get('vs_eager_ref', {}).get('equal') for r in runs if r['step'] == step]}, "
            f"max abs diff {[round(r.get('vs_eager_ref', {}).get('max_abs_diff', -1), 6) for r in runs if r['step'] == step]}")
    for step in ("warm", "aot_kept", "aot_fresh"):
        rs = [r for r in runs if r["step"] == step and r.get("counters")]
        if rs:
            c = rs[0]["counters"]
            say(f"  {step} counters (first run): frames={c.get('frames')} stats={c.get('stats')} "
                f"inductor={ {k: w for k, w in c.get('inductor', {}).items() if 'cache' in k} } "
                f"aot_autograd={ {k: w for k, w in c.get('aot_autograd', {}).items() if 'cache' in k} }")
    if safety:
        say()
        say("safety (loaded AOT artifact in a new process; reference = eager unless noted):")
        for name, res in safety.get("checks", {}).items():
            detail = {k: w for k, w in res.items() if k not in ("outcome", "note")}
            say(f"  {name:48s} {res.get('outcome')}  {json.dumps(detail, default=str)[:400]}")
        for k in ("counters_after_load_and_call", "code_state_before", "code_state_after_load_and_call",
                  "main_globals_added_by_load", "model_module_globals_added_by_load",
                  "counters_plain_compile_before", "counters_plain_compile_after",
                  "code_state_after_plain_compile", "main_globals_added_in_safety_step", "probe_globals_now"):
            say(f"  {k}: {json.dumps(safety.get(k), default=str)[:600]}")
    if prof.get("profile"):
        say()
        say(f"cProfile of one extra load + first call (kept dirs; not in the table; {prof.get('t_first')} s under the profiler):")
        say(prof["profile"])
    say(f"build: globals the build added to __main__: {build.get('main_globals_added_by_build')}")
    say(f"total wall {time.perf_counter() - start:.1f}s")
    say()
    say("every run, in order:")
    for r in runs:
        say("  " + json.dumps({k: w for k, w in r.items()
                                if k not in ("checks", "counters", "aot_traceback", "stderr_tail", "profile")}, default=str)[:900])
    for r in runs:
        if r.get("aot_traceback"):
            say("aot traceback:\n" + r["aot_traceback"])
    with open(os.path.join(a.out, "moonshot.log"), "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(a.out, "results.json"), "w") as f:
        json.dump(runs, f, indent=1, default=str)
    g = os.path.join(work, "artifacts", "guards.txt")
    if os.path.exists(g):
        shutil.copy(g, os.path.join(a.out, "guards.txt"))


if __name__ == "__main__":
    main()

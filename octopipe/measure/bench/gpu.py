"""GPU checks of the runtime: what the machine is, whether pipelines whose layers compute on the
GPU train exactly like the single-process reference, NCCL where there is a GPU per rank, and each
layer's F/I/W time on the GPU (`cost=profiled`).

    python -m octopipe.measure.bench.gpu [--ranks 2 4] [--out runs/bench/gpu]

With fewer GPUs than ranks the ranks share them and their transfers go through gloo, staged
through host memory: NCCL refuses two ranks on one GPU ("Duplicate GPU detected"), which the
NCCL probe records. Each check is recorded with its outcome, so one failure hides no other.
"""
from __future__ import annotations

import argparse
import os
import time
import traceback
from dataclasses import replace
from pathlib import Path

import torch
from omegaconf import OmegaConf

from octopipe.config.runtime import RuntimeConfig
from octopipe.cost.profiled import time_layers
from octopipe.io import CONF_DIR, write_json
from octopipe.model.build import build_model
from octopipe.plan import Plan, uniform_partition
from octopipe.runtime.job import Job
from octopipe.runtime.launch import execute
from octopipe.runtime.stage import max_rel_err, reference_run
from octopipe.schedule.library import build_schedule

TOLERANCE = 1e-5     # fp32, as on the CPU; atomics in some CUDA backward kernels reorder sums
CASES = (("tiny_hybrid", "1f1b", 2, "strict"), ("tiny_hybrid", "zbv", 2, "ready_first"),
         ("tiny_hybrid", "interleaved", 4, "ready_first"), ("tiny_moe", "zbh1", 2, "strict"),
         ("tiny_vlm", "1f1b", 2, "ready_first"))


def _preset(name: str, micro_batch_size: int | None = None):
    model = build_model(OmegaConf.load(CONF_DIR / "model" / f"{name}.yaml"))
    return replace(model, micro_batch_size=micro_batch_size) if micro_batch_size else model


def facts() -> dict:
    out = {"torch": torch.__version__, "cuda_available": torch.cuda.is_available(),
           "cpu_cores": os.cpu_count()}
    if torch.cuda.is_available():
        out.update(cuda=torch.version.cuda, device_count=torch.cuda.device_count(),
                   device_name=torch.cuda.get_device_name(0),
                   nccl=".".join(map(str, torch.cuda.nccl.version())))
    return out


def exactness(model_name: str, schedule: str, ranks: int, dispatch: str, backend: str, m: int,
              device: str = "cuda") -> dict:
    """One pipeline on `device` against the single-process reference on the same device and on
    the CPU: losses and every parameter's gradient."""
    model = _preset(model_name)
    table = build_schedule(schedule, ranks, m)
    plan = Plan(uniform_partition(model.n_layers, table.n_stages), table, model.name)
    config = RuntimeConfig(backend=backend, device=device, dispatch=dispatch, iterations=2, warmup=0)
    t0 = time.perf_counter()
    res = execute(Job(plan, model, config))
    wall = time.perf_counter() - t0
    ref_dev = reference_run(model, m, iterations=2, device=device)
    ref_cpu = reference_run(model, m, iterations=2)
    err_dev, err_cpu = max_rel_err(res.grads, ref_dev.grads), max_rel_err(res.grads, ref_cpu.grads)
    loss_err = max(abs(a - b) / max(1.0, abs(b)) for a, b in zip(res.losses, ref_dev.losses))
    return {"model": model_name, "schedule": schedule, "ranks": ranks, "dispatch": dispatch,
            "backend": backend, "device": device, "microbatches": m,
            "grad_max_rel_err_vs_same_device": err_dev, "grad_max_rel_err_vs_cpu": err_cpu,
            "losses": [float(x) for x in res.losses], "reference_losses": ref_dev.losses,
            "loss_rel_err": loss_err,
            "iteration_s": [float(x) for x in res.iteration_s], "launch_s": wall,
            "ok": err_dev <= TOLERANCE and loss_err <= TOLERANCE}


def profile(model_name: str, micro_batch_size: int) -> dict:
    model = _preset(model_name, micro_batch_size)
    times = time_layers(model, torch.device("cuda"), repeats=9, warmup=3)
    return {"model": model_name, "micro_batch_size": micro_batch_size,
            "layers": [{"index": j, "kind": model.layers[j].kind.value, **t} for j, t in enumerate(times)]}


def _check(name: str, fn, results: list[dict]) -> dict | None:
    t0 = time.perf_counter()
    try:
        out = fn()
        results.append({"check": name, "status": "ok" if out.get("ok", True) else "mismatch",
                        "seconds": time.perf_counter() - t0, **out})
    except Exception as e:
        first = next((ln.strip() for ln in str(e).splitlines() if ln.strip()), type(e).__name__)
        out = None
        results.append({"check": name, "status": "error", "seconds": time.perf_counter() - t0,
                        "error": f"{type(e).__name__}: {first}", "traceback": traceback.format_exc()[-3000:]})
    r = results[-1]
    detail = r.get("error") or ", ".join(f"{k}={v:.2e}" if isinstance(v, float) else f"{k}={v}"
                                         for k, v in r.items() if k.startswith("grad_") or k == "loss_rel_err")
    print(f"{name:48s} {r['status']:8s} {r['seconds']:6.1f} s  {detail}", flush=True)
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--microbatches", type=int, default=4)
    ap.add_argument("--profile-micro-batch-size", type=int, default=8)
    ap.add_argument("--out", default="runs/bench/gpu")
    args = ap.parse_args(argv)
    doc: dict = {"facts": facts(), "checks": []}
    print(doc["facts"], flush=True)
    if not torch.cuda.is_available():
        raise SystemExit("no CUDA device here: the GPU checks need one (the CPU runtime is tested by pytest)")
    checks, m = doc["checks"], args.microbatches
    n_gpu = torch.cuda.device_count()
    for model_name, schedule, ranks, dispatch in CASES:
        _check(f"cuda+gloo {model_name} {schedule} {ranks} ranks {dispatch}",
               lambda: exactness(model_name, schedule, ranks, dispatch, "gloo", m), checks)
    if n_gpu >= 2:
        for schedule, dispatch in (("1f1b", "strict"), ("zbv", "ready_first"), ("interleaved", "ready_first")):
            ranks = min(n_gpu, 4)
            _check(f"nccl tiny_hybrid {schedule} {ranks} ranks {dispatch}",
                   lambda: exactness("tiny_hybrid", schedule, ranks, dispatch, "nccl", m), checks)
    else:
        _check("nccl probe: 2 ranks on one GPU",
               lambda: exactness("tiny_hybrid", "1f1b", 2, "strict", "nccl", m), checks)
    _check(f"profile tiny_hybrid on cuda (micro-batch {args.profile_micro_batch_size})",
           lambda: profile("tiny_hybrid", args.profile_micro_batch_size), checks)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "gpu_checks.json", doc)
    return doc


if __name__ == "__main__":
    main()

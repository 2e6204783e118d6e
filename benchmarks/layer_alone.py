"""One layer timed alone (as `plan` times its compute input) against the same layers timed in a
stage (as `step`'s compute-only runs them), on this machine's device: per layer, forward and
backward. On the H100 the first gave 10.69 ms and the step implied about 8.6 ms (issue 31's
notes); this says which differs and, with --profile, in which kernels.

    python benchmarks/layer_alone.py [--model SHAPE] [--dtype bfloat16] [--profile] [--json F]

Each variant is warmed for --warm-s seconds of its own work, then timed REPS times over at least
--min-s seconds, the median kept. Nothing here is a test: the figures are for a person to read.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from distbench.planner.models import parse_model  # noqa: E402
from distbench.steps import mesh_model  # noqa: E402

SHAPE_1B = "layers=24,hidden=2048,ffn=8192,heads=16,seq=2048,batch=8"
REPS = 5


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device, warm_s: float, min_s: float) -> float:
    """Seconds per call of fn: warmed for warm_s, then REPS runs of n calls, the median."""
    t0 = time.perf_counter()
    calls = 0
    while calls < 2 or time.perf_counter() - t0 < warm_s:
        fn()
        calls += 1
        sync(device)
    once = (time.perf_counter() - t0) / calls
    n = max(3, int(min_s / max(once, 1e-6)))
    reps = []
    for _ in range(REPS):
        sync(device)
        t = time.perf_counter()
        for _ in range(n):
            fn()
        sync(device)
        reps.append((time.perf_counter() - t) / n)
    return statistics.median(reps)


def variants(model, device, dtype):
    """(name, layers, fn) for each way of running the layers."""
    g = torch.Generator().manual_seed(1)
    dims = (model.batch, model.seq_len, model.hidden_size)
    x = torch.randn(dims, generator=g).to(device, dtype)
    dy = torch.randn(dims, generator=g).to(device, dtype)
    out = []

    def stage_fn(stage, xin, grad_out, zero_grads):
        def fn():
            if zero_grads:
                for p in stage.parameters():
                    p.grad = None
            y = stage(xin)
            if grad_out is None:
                F.mse_loss(y, dy).backward()
            else:
                y.backward(grad_out)
        return fn

    one = mesh_model.make_stage(model, range(1), device, dtype)
    xg = x.clone().requires_grad_(True)
    out.append(("alone as plan times it (input needs grad, grads accumulate)", 1,
                stage_fn(one, xg, dy, False)))
    out.append(("alone, grads set to None each call", 1, stage_fn(one, xg, dy, True)))
    out.append(("alone, input needs no grad", 1, stage_fn(one, x, dy, True)))
    out.append(("alone, output gradient 1e-3 x", 1, stage_fn(one, xg, dy * 1e-3, True)))
    for k in sorted({2, 4, model.layers}):
        stage = mesh_model.make_stage(model, range(k), device, dtype)
        out.append((f"stage of {k} as compute-only runs it (mse loss)", k,
                    stage_fn(stage, x, None, True)))
    out.append((f"stage of {model.layers}, input needs grad, output gradient given",
                model.layers, stage_fn(stage, xg, dy, True)))
    return out


def trained_variants(model, device, dtype, steps: int, lrs: list[float]):
    """A stage of every layer after `steps` AdamW steps (as `step` trains: mse against random
    targets) at each learning rate: training moves the weights, and a matmul's speed on a GPU
    depends on the values it multiplies (their power draw), not only on their shapes."""
    from distbench.steps.dp_model import optimizer_class

    g = torch.Generator().manual_seed(2)
    dims = (model.batch, model.seq_len, model.hidden_size)
    x = torch.randn(dims, generator=g).to(device, dtype)
    target = torch.randn(dims, generator=g).to(device, dtype)
    out = []
    for lr in lrs:
        stage = mesh_model.make_stage(model, range(model.layers), device, dtype)
        built = [p.detach().float().norm() for p in stage.parameters()]
        fused = {"fused": True} if device.type == "cuda" else {}
        opt = optimizer_class(dtype)(list(stage.parameters()), lr=lr, eps=1e-8, **fused)
        for _ in range(steps):
            opt.zero_grad(set_to_none=True)
            F.mse_loss(stage(x), target).backward()
            opt.step()
        moved = max(float(d.norm() / b) for d, b in zip(
            (p.detach().float() for p in stage.parameters()), built, strict=True)) if steps else 0
        with torch.no_grad():
            y = stage(x).float()
        moved_text = f"weights' norms now up to {moved:.2f} x built, output std {y.std():.3g}"

        def fn(stage=stage):
            for p in stage.parameters():
                p.grad = None
            F.mse_loss(stage(x), target).backward()
        out.append((f"stage of {model.layers} after {steps} AdamW steps at lr {lr:g} "
                    f"({moved_text})", model.layers, fn))
        opt = None
    return out


def kernel_table(fn, device, rows: int = 12) -> list[str]:
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=acts) as prof:
        for _ in range(3):
            fn()
        sync(device)
    key = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    return prof.key_averages().table(sort_by=key, row_limit=rows).splitlines()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=SHAPE_1B)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--warm-s", type=float, default=1.0)
    ap.add_argument("--min-s", type=float, default=0.5)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--trained", type=int, default=None, metavar="STEPS",
                    help="also time the stage after STEPS AdamW steps at each --lr")
    ap.add_argument("--lr", type=float, nargs="+", default=[1e-2, 3e-4])
    ap.add_argument("--only-trained", action="store_true")
    args = ap.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = getattr(torch, args.dtype)
    model = parse_model("--model", args.model)
    print(f"device {torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu'}, "
          f"torch {torch.__version__}, {args.model}, {args.dtype}")
    flops = model.flops_per_layer(model.batch * model.seq_len)
    results = []
    runs = [] if args.only_trained else variants(model, device, dtype)
    if args.trained is not None:
        runs += trained_variants(model, device, dtype, args.trained, args.lr)
    for name, layers, fn in runs:
        per_layer = timed(fn, device, args.warm_s, args.min_s) / layers
        results.append({"variant": name, "layers": layers, "ms_per_layer": per_layer * 1e3,
                        "tflops": flops / per_layer / 1e12})
        print(f"{per_layer * 1e3:9.3f} ms/layer {flops / per_layer / 1e12:7.1f} TFLOP/s  {name}",
              flush=True)
    if args.profile:
        for name, layers, fn in runs[-1:] if args.only_trained else [runs[0], runs[-1]]:
            print(f"\n--- kernels, 3 calls of: {name} ({layers} layers)")
            print("\n".join(kernel_table(fn, device)))
    if args.json:
        args.json.write_text(json.dumps({"model": args.model, "dtype": args.dtype,
                                         "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

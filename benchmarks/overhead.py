"""Is distbench's own overhead nil? Its reported all_reduce time against the least possible
timing loop (barrier, timer, back-to-back ops, the device's sync, timer; each rank's mean,
averaged over ranks), on the same sizes and buffers, alternating A/B so machine noise hits both
alike.

    python benchmarks/overhead.py [--sizes 1M,4M,16M] [--rounds 15] [--workers N]
                                  [--backend auto|nccl|gloo]

The backend is picked as distbench picks it (nccl with CUDA, else gloo) and the buffers live on
the rank's device (cuda:local_rank under nccl, else the CPU). Run as is, it starts its own local
workers (one per GPU under nccl, else 2); under torchrun it is one rank. Rank 0 first prints
what the timed loop's own instrumentation costs per iteration on that device, measured alone
(CUDA events on GPU, perf_counter on CPU), then one line per size: the median time of each, the
median and interquartile range of the per-round ratio distbench / baseline (target: within +-3%
at sizes >= 1 MiB), the same for a second baseline run against the first (A/A), which shows how
much of the gap is this machine's noise, and whether distbench's median ratio lies within the
A/A ratios' interquartile range ("noise") or outside it ("outside A/A").
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time

from distbench.core.options import BACKENDS
from distbench.core.sizes import format_size, parse_sizes
from distbench.platform.env import under_launcher
from distbench.run.launch import run_local_workers


def args_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="64K,1M,4M,16M")
    p.add_argument("--rounds", type=int, default=30, help="at least 2: each ratio's quartiles")
    p.add_argument("--workers", type=int, default=None,
                   help="local workers outside torchrun (default: one per GPU under nccl, else 2)")
    p.add_argument("--backend", choices=BACKENDS, default="auto",
                   help="auto: nccl with CUDA, else gloo, as distbench picks it")
    p.add_argument("--target-ms", type=float, default=100.0,
                   help="timed work per measurement, to pick a fixed iteration count per size")
    return p


def worker(args) -> None:
    import torch
    import torch.distributed as dist

    from distbench.bench import series, timing
    from distbench.bench.combinations import combinations
    from distbench.bench.measure import Settings, measure_case
    from distbench.core.accounting import buffer_of
    from distbench.core.options import build
    from distbench.kinds.collective.options import CollectiveOptions
    from distbench.kinds.collective.output import OUTPUT
    from distbench.run import runtime
    from distbench.run.session import Session
    from distbench.run.split import split

    sizes = parse_sizes(args.sizes)
    opts = build(CollectiveOptions, {"op": "all_reduce", "sizes": args.sizes, "iters": 1,
                                     "warmup": 1, "check": False, "backend": args.backend,
                                     "out": tempfile.gettempdir()}, argv=[])
    rt = runtime.start(opts.backend, opts.timeout, opts.identity())
    s = Session("collective", opts, rt)
    n, rank, device = rt.world, rt.rank, rt.device
    (combo,) = combinations(opts.ops, opts.dtypes, opts.redops, opts.root, opts.placement)
    with split(rt, n, 1, opts.timeout) as world:  # the world as one group: nothing is made
        ser = series.collective(s, combo, OUTPUT, world)  # the engine's, minus sink and console
    lays = {size: buffer_of(combo.op.accounting, size, 4, n) for size in sizes}
    bufs = ser.alloc(max(lay.per_rank_count for lay in lays.values()))

    def baseline(buf, iters) -> float:
        dist.all_reduce(buf)  # the one untimed op every measurement starts with
        if device.type == "cuda":  # distbench's warmup ends on the device's sync too
            torch.cuda.synchronize(device)
        dist.barrier()
        start = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(buf)
        # Under nccl the ops are only queued: distbench's loop waits for its last CUDA event,
        # so this one waits for the device, or it would time the launches and not the work.
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        mean = torch.tensor([(time.perf_counter() - start) / iters], dtype=torch.float64,
                            device=device)
        dist.all_reduce(mean)
        return float(mean.item()) / n * 1e6

    where = str(device)
    if device.type == "cuda":
        where += f" ({torch.cuda.get_device_name(device)}) on rank 0"
    # Rank 0 alone while the others wait: on a small machine a second busy rank is the noise.
    if rank == 0:
        cost = instrumentation_cost(device)
        clock = "CUDA events" if device.type == "cuda" else "perf_counter"
        print(f"# timed-loop instrumentation ({clock}, {where}): {cost:.0f} ns per iteration "
              "over a bare loop", flush=True)
    dist.barrier()
    if rank == 0:
        print(f"# all_reduce float32, backend {rt.backend}, device {where}, {n} ranks, "
              f"{args.rounds} alternating rounds; times are medians over rounds")
        print(f"{'size':>10} {'iters':>6} {'distbench(us)':>14} {'baseline(us)':>13} "
              f"{'ratio':>7} {'ratio IQR':>13} {'A/A ratio':>9} {'A/A IQR':>13}  verdict",
              flush=True)
    for size in sizes:
        lay = lays[size]
        buf = bufs[0][:lay.per_rank_count]
        (point,) = ser.points(bufs, lay)
        case = point.case
        # one iteration count per size, agreed by all ranks, used by both methods
        _, per_op = timing.warmup_and_calibrate(lambda b=buf: dist.all_reduce(b), 2, None,
                                                0.1, device)
        iters = timing.calibrated_iters(per_op, args.target_ms / 1e3)
        opts.iters = iters
        ours, base, control = [], [], []
        for r in range(args.rounds):
            # rotate the order so no arm always runs first
            arms = ["ours", "base", "control"]
            for which in arms[r % 3:] + arms[:r % 3]:
                if which == "ours":
                    st = measure_case(Settings.of(s), case, "bench", size)
                    ours.append(point.columns(st)["time_us"])
                else:
                    case.prepare()  # the same data distbench's own measurement starts from
                    (base if which == "base" else control).append(baseline(buf, iters))
        s.watchdog.disarm()
        if rank == 0:
            # paired: each round's ratio, so slow drifts of the machine cancel out
            q1, med, q3 = statistics.quantiles([a / b for a, b in zip(ours, base, strict=True)],
                                               n=4)
            # the baseline against itself: the noise floor this machine allows
            a1, aa, a3 = statistics.quantiles(
                [c / b for c, b in zip(control, base, strict=True)], n=4)
            verdict = "noise" if a1 <= med <= a3 else "outside A/A"
            print(f"{format_size(lay.size_bytes):>10} {iters:>6} {statistics.median(ours):>14.1f} "
                  f"{statistics.median(base):>13.1f} {med:>7.3f} {q1:>6.3f}-{q3:<6.3f} "
                  f"{aa:>9.3f} {a1:>6.3f}-{a3:<6.3f}  {verdict}", flush=True)
    dist.destroy_process_group()


def instrumentation_cost(device, repeats: int = 7) -> float:
    """Nanoseconds distbench's timed loop on `device` adds per iteration over a bare loop, both
    calling the same no-op and ending with the same sync: on CPU a timestamp and a list store, on
    GPU a CUDA event recorded on the stream (host time: it matters once the host cannot keep
    ahead of the GPU). The part of the overhead that noise cannot hide, measured without a
    collective. The whole call is timed, so the set-up and the differences taken after the
    loop count too: an upper bound on what lands inside the timed region."""
    import torch

    from distbench.bench import timing

    cuda = device.type == "cuda"
    # A timed loop never runs more than MAX_ITERS, and on GPU each iteration holds a CUDA event.
    iters = timing.MAX_ITERS if cuda else 200_000

    def noop():
        return None

    def bare():
        start = time.perf_counter()
        for _ in range(iters):
            noop()
        if cuda:  # timed_loop waits for its last event; the bare loop pays a sync too
            torch.cuda.synchronize(device)
        return time.perf_counter() - start

    def ours():
        start = time.perf_counter()
        timing.timed_loop(noop, iters, device)
        return time.perf_counter() - start

    diffs = [(ours() - bare()) / iters * 1e9 for _ in range(repeats)]
    return statistics.median(diffs)


def main() -> int:
    parser = args_parser()
    args = parser.parse_args()
    if args.rounds < 2:
        parser.error("--rounds: at least 2 (each ratio's quartiles need two rounds)")
    from distbench.run.runtime import RunFailure, resolve_backend

    try:
        if under_launcher():
            worker(args)
            return 0
        backend = resolve_backend(args.backend)
    except RunFailure as e:
        print(f"overhead.py: error: {e}", file=sys.stderr)
        return e.exit_code
    if args.workers is None:
        import torch

        args.workers = torch.cuda.device_count() if backend == "nccl" else 2
    run_local_workers(args.workers, [__file__, *sys.argv[1:]])
    return 0


if __name__ == "__main__":
    sys.exit(main())

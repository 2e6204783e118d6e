"""torchtitan's published runs, predicted through `distbench plan`'s command line (issue 46,
item 8): a test set kept apart from the planner's own, nothing measured, one compute scale per
GPU kind.

    python benchmarks/published_runs.py [--check] [--fit h100=ROW] [--unscored] [--jobs 2]

The rows: benchmarks/published/torchtitan.csv, every throughput pytorch/torchtitan published
(docs/performance.md in its 2024 versions, benchmarks/*.md since 2025-06), each with the file,
commit and table it came from. What a row needs and distbench lacks leaves it unscored, and the
table says why: float8 linears, torch.compile, context parallelism, a pipeline schedule
other than 1F1B or interleaved 1F1B, pipeline micro-batches the source does not give, or a GPU
kind with no fitted scale.

Each scored row becomes one command line, `distbench plan --fabric dgx-h100|dgx-a100 --gpus N
--gpu-memory G --model <the shape>,batch=<global batch> --dtype bfloat16 --layout <the
layout> --trainer torch --mfu F --out DIR`, run as a subprocess; its plan.csv's row with
`given` 1 is the prediction. torchtitan's layouts in distbench's keys:

- FSDP (dp_shard) is `zero=3`: FSDP2 reshards after forward. HSDP (dp_replicate) has no key.
- TP is `tp=`, with `sp=1`: torchtitan's TP plan shards the norms along the sequence.
  Async TP is `tp_overlap=1`.
- PP is `pp=`; interleaved 1F1B adds `v=`; torch's pipelining synchronises FSDP's gradients on
  the last micro-batch only, `grad_sync=last`.
- Activation checkpointing: full is `recompute=full`, per-op selective `recompute=op`, and
  selective layer with ac_freq k (each layer wrapped counts from 1, and every k-th is
  checkpointed whole: torchtitan's checkpoint_wrapper) is `recompute=full,recompute_layers=
  floor(layers / k)`.
- The local batch is `mbs` without a pipeline (torchtitan then runs one micro-batch a step);
  with one, the local batch over the pipeline's micro-batches.

torchtitan's tokens per second per GPU (its `wps`/`tps`: the rank's tokens over the step's
time and tp x pp x cp) stand for a step of global batch x seq / (tps x GPUs) seconds.
The compute scale (`--mfu`) of each GPU kind is solved on the row named in FIT_ROWS, fixed
before any prediction was seen, so that its predicted step equals the published one; every
other row is out of sample.
"""

from __future__ import annotations

import argparse
import math
import shlex
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from distbench.core.tables import markdown_table  # noqa: E402

CSV = ROOT / "benchmarks" / "published" / "torchtitan.csv"
FABRICS = {"h100": "dgx-h100", "a100": "dgx-a100", "h200": "dgx-h200"}
# Named before any prediction was run. h100: the one-node run (8 GPUs, FSDP inside NVLink) of
# the only recipe the December 2024 tables ran without compile, so the scale is mostly compute
# and the 128-GPU row tests the communication across nodes. a100: the same model and recipe
# (8B, FSDP, per-op selective AC: torchtitan's 8B preset), so both kinds' scales mean the
# same thing.
FIT_ROWS = {"h100": "d24-t1-fsdp", "a100": "a24-l3-8b-64a100-op"}
DTYPE = "bfloat16"
MAPE_BAR = 15.0
# pairs whose published throughputs differ by less than this are within run-to-run noise and
# the tables' rounding: their order says nothing
APART = 1.10
SCHEDULES = ("", "1F1B", "Interleaved1F1B")
MFU_LOW, MFU_HIGH = 0.05, 1.0
FIT_TOLERANCE = 1e-4
JOBS = 2  # the CLI runs beside other work on a 2-core machine


@dataclass
class Outcome:
    """One CLI call: its plan.csv row with `given` 1, or the line it was refused with."""

    row: dict | None
    refused: str = ""
    command: list[str] = field(default_factory=list)


def load(path: Path = CSV) -> list[dict]:
    frame = pd.read_csv(path, dtype={"source_commit": str}, keep_default_na=False)
    return frame.to_dict("records")


def _num(value) -> float:
    return float(value) if value not in ("", None) else math.nan


def published_step_s(row: dict) -> float:
    """The step a published throughput stands for: the global batch's tokens over the tokens
    every GPU processed a second."""
    return row["global_batch"] * row["seq"] / (_num(row["tps_per_gpu"]) * row["gpus"])


def unscored_because(row: dict) -> list[str]:
    """What the row needs that distbench lacks (or what the source does not say)."""
    out = []
    if int(row["float8"]):
        out.append("float8 linears (distbench prices 16-bit matmuls only)")
    if int(row["compile"]):
        out.append("torch.compile (fused kernels the datasheet scale does not know)")
    if int(row["cp"]) > 1:
        out.append(f"context parallelism cp {row['cp']} (no layout key)")
    if row["pp_schedule"] not in SCHEDULES:
        out.append(f"pipeline schedule {row['pp_schedule']} (1F1B and interleaved only)")
    if int(row["pp"]) > 1 and not row["pp_microbatches"]:
        out.append("pipeline micro-batches and stages a rank not published")
    if row["gpu"] not in FIT_ROWS:
        out.append(f"no {row['gpu']} row to fit a compute scale on")
    return out


def layout_of(row: dict) -> str:
    """The row's layout in `--layout`'s keys."""
    tp, pp, fsdp = int(row["tp"]), int(row["pp"]), int(row["fsdp"])
    keys = [f"tp={tp}", f"pp={pp}", f"dp={fsdp}"]
    if fsdp > 1:
        keys.append("zero=3")
    if pp > 1:
        m = int(row["pp_microbatches"]) if row["pp_microbatches"] else pp
        keys.append(f"mbs={int(row['local_batch']) // m}")
        v = int(row["virtual_stages"] or 1)
        if v > 1:
            keys.append(f"v={v}")
    else:
        keys.append(f"mbs={int(row['local_batch'])}")
    ac = row["ac"]
    if ac == "layer":
        # the wrapper's counter runs over the whole model, so this holds without a pipeline only
        stage = math.ceil(int(row["layers"]) / pp)
        keys += ["recompute=full",
                 f"recompute_layers={stage // int(row['ac_layer_freq'])}"]
    else:
        keys.append(f"recompute={ac}")
    if tp > 1:
        keys.append("sp=1")
        if int(row["async_tp"]):
            keys.append("tp_overlap=1")
    if pp > 1 and fsdp > 1:
        keys.append("grad_sync=last")
    return ",".join(keys)


def model_of(row: dict) -> str:
    return (f"layers={row['layers']},hidden={row['hidden']},ffn={row['ffn']},"
            f"heads={row['heads']},kv_heads={row['kv_heads']},vocab={row['vocab']},gated=1,"
            f"seq={row['seq']},batch={row['global_batch']}")


def command(row: dict, mfu: float | None, out: Path) -> list[str]:
    cmd = [sys.executable, "-m", "distbench", "plan", "--fabric", FABRICS[row["gpu"]],
           "--gpus", str(row["gpus"]), "--gpu-memory", f"{row['gpu_memory_gib']}G",
           "--model", model_of(row), "--dtype", DTYPE, "--layout", layout_of(row),
           "--trainer", "torch", "--top", "1", "--no-plot", "--out", str(out)]
    return cmd + (["--mfu", f"{mfu:.6f}"] if mfu is not None else [])


def run_cli(row: dict, mfu: float | None) -> Outcome:
    with tempfile.TemporaryDirectory(prefix="published-") as tmp:
        cmd = command(row, mfu, Path(tmp))
        res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
        if res.returncode != 0:
            lines = [ln for ln in (res.stderr + res.stdout).splitlines() if ln.strip()]
            return Outcome(None, f"exit {res.returncode}: {lines[-1] if lines else ''}", cmd)
        [plan_csv] = Path(tmp).glob("*/plan.csv")
        plan = pd.read_csv(plan_csv)
        given = plan[plan["given"] == 1]
        if len(given) != 1:
            return Outcome(None, f"{len(given)} rows with given 1 in plan.csv", cmd)
        return Outcome(given.iloc[0].to_dict(), "", cmd)


def fit_mfu(row: dict) -> tuple[float | None, int, str]:
    """(--mfu at which the row's predicted step is its published one, CLI calls, why not).

    The prediction grows with 1/mfu (compute and the bubble scale with it, communication does
    not, overlap hides less of it as compute shrinks), so the root is bracketed between
    MFU_LOW and MFU_HIGH and found by false position with the Illinois step, which keeps the
    bracket as bisection does and needs a handful of calls where bisection needs a dozen."""
    target = published_step_s(row) * 1e3
    calls = 0

    def gap(x: float) -> float:
        nonlocal calls
        calls += 1
        got = run_cli(row, 1 / x)
        if got.row is None:
            raise RuntimeError(got.refused)
        return got.row["predicted_step_ms"] - target

    try:
        return _solve(gap, target), calls, ""
    except RuntimeError as e:
        return None, calls, str(e)


def _solve(gap, target: float) -> float:
    """The --mfu at which gap(1 / mfu) is 0, gap rising with its argument."""
    lo, hi = 1 / MFU_HIGH, 1 / MFU_LOW
    f_lo, f_hi = gap(lo), gap(hi)
    if f_lo > 0:
        raise RuntimeError(f"predicted {target + f_lo:.0f} ms at --mfu {MFU_HIGH} against "
                           f"{target:.0f} ms published: no compute scale reaches it")
    if f_hi < 0:
        raise RuntimeError(f"predicted under the published step even at --mfu {MFU_LOW}")
    side, x = 0, lo
    for _ in range(40):
        x = hi - f_hi * (hi - lo) / (f_hi - f_lo)
        f_x = gap(x)
        if abs(f_x) <= FIT_TOLERANCE * target:
            break
        # Illinois: halve the end kept twice in a row, or false position crawls toward it
        if f_x < 0:
            lo, f_lo = x, f_x
            if side == -1:
                f_hi /= 2
            side = -1
        else:
            hi, f_hi = x, f_x
            if side == 1:
                f_lo /= 2
            side = 1
    return 1 / x


@dataclass
class Result:
    row: dict
    layout: str
    sample: str  # "in" for a fit row
    mfu: float | None
    outcome: Outcome

    @property
    def published_s(self) -> float:
        return published_step_s(self.row)

    @property
    def predicted_s(self) -> float:
        return self.outcome.row["predicted_step_ms"] / 1e3

    @property
    def error_pct(self) -> float:
        return (self.predicted_s / self.published_s - 1) * 100

    @property
    def predicted_tps(self) -> float:
        row = self.row
        return row["global_batch"] * row["seq"] / (self.predicted_s * row["gpus"])


def evaluate(rows: list[dict], fit_rows: dict[str, str], jobs: int, unscored: bool
             ) -> tuple[dict, list[Result], list[Result]]:
    """(per GPU kind (mfu, calls, why unfitted), the scored and out-of-memory rows' results,
    the unscored rows' results where `unscored` asks for their memory)."""
    by_id = {r["id"]: r for r in rows}
    with ThreadPoolExecutor(max_workers=max(1, min(jobs, JOBS))) as pool:
        fits = dict(zip(fit_rows, pool.map(lambda k: fit_mfu(by_id[fit_rows[k]]), fit_rows),
                        strict=True))
        scored = [r for r in rows if not unscored_because(r)]
        extra = [r for r in rows if unscored_because(r) and unscored
                 and r["gpu"] in fits and int(r["cp"]) == 1
                 and r["pp_schedule"] in SCHEDULES and (int(r["pp"]) == 1
                                                        or r["pp_microbatches"])]

        def one(row: dict) -> Result:
            mfu = fits[row["gpu"]][0]
            sample = "in" if fit_rows.get(row["gpu"]) == row["id"] else "out"
            return Result(row, layout_of(row), sample, mfu, run_cli(row, mfu))

        results = list(pool.map(one, scored))
        others = list(pool.map(one, extra))
    return fits, results, others


def mape(results: list[Result]) -> float:
    return sum(abs(r.error_pct) for r in results) / len(results) if results else math.nan


def apart_pairs(results: list[Result]) -> list[tuple[Result, Result, bool]]:
    """Pairs on the same model and GPU kind whose published throughputs differ by more than
    APART, each with whether the prediction orders them alike."""
    out = []
    for i, a in enumerate(results):
        for b in results[i + 1:]:
            if (a.row["model"], a.row["gpu"]) != (b.row["model"], b.row["gpu"]):
                continue
            pa, pb = _num(a.row["tps_per_gpu"]), _num(b.row["tps_per_gpu"])
            if max(pa, pb) / min(pa, pb) <= APART:
                continue
            out.append((a, b, (pa > pb) == (a.predicted_tps > b.predicted_tps)))
    return out


def shown(cmd: list[str]) -> str:
    """A CLI call as a user types it."""
    args = cmd[3:]
    args[args.index("--out") + 1] = "DIR"
    return shlex.join(["distbench", *args])


def _gib(value: float) -> str:
    return f"{value / 2**30:.1f}" if not math.isnan(value) else ""


def report(rows: list[dict], fit_rows: dict[str, str], fits: dict, results: list[Result],
           others: list[Result]) -> tuple[list[str], list[tuple[str, bool]]]:
    """The printed lines, and the Done-when bars, each (what, holds)."""
    lines = []
    for kind, (mfu, calls, why) in fits.items():
        fit_id = fit_rows[kind]
        if mfu is None:
            lines.append(f"- {kind}: UNFITTED, the CLI's default --mfu used: {fit_id}: {why}")
        else:
            lines.append(f"- {kind}: --fabric {FABRICS[kind]} --mfu {mfu:.4f}, solved on "
                         f"{fit_id} ({calls} CLI calls)")
        lines += [f"  `{shown(r.outcome.command)}`" for r in results if r.row["id"] == fit_id]
    ran = [r for r in results if int(r.row["ran"])]
    timed = [r for r in ran if r.outcome.row is not None]
    refused = [r for r in results if r.outcome.row is None]
    oom = [r for r in results if not int(r.row["ran"]) and r.outcome.row is not None]
    head = ["row", "model", "GPUs", "layout", "published tok/s/GPU", "published step (s)",
            "predicted step (s)", "error", "memory (GiB)", "published memory (GiB)", "fits",
            "sample"]
    cells = [[r.row["id"], r.row["model"], f"{r.row['gpus']} {r.row['gpu']}", r.layout,
              f"{_num(r.row['tps_per_gpu']):g}", f"{r.published_s:.2f}", f"{r.predicted_s:.2f}",
              f"{r.error_pct:+.1f}%", _gib(r.outcome.row["memory_per_rank_bytes"]),
              f"{_num(r.row['memory_gib']):g}" if r.row["memory_gib"] != "" else "",
              "yes" if r.outcome.row["fits"] else "no",
              r.sample if fits[r.row["gpu"]][0] is not None else "unfitted"]
             for r in timed]
    lines += ["", *markdown_table(head, cells, "llllrrrrrrll")]
    if oom:
        lines += ["", "Runs the source says went out of memory:"]
        lines += [f"- {r.row['id']} ({r.layout}): {_gib(r.outcome.row['memory_per_rank_bytes'])}"
                  f" GiB a rank, {'fits (wrong)' if r.outcome.row['fits'] else 'does not fit'}"
                  for r in oom]
    if refused:
        lines += ["", "Refused by the CLI (no prediction):"]
        lines += [f"- {r.row['id']} ({r.layout}): {r.outcome.refused}" for r in refused]
    lines += ["", "Unscored (the source's run needs what distbench lacks):"]
    lines += [f"- {r['id']}: {'; '.join(unscored_because(r))}"
              for r in rows if unscored_because(r)]
    if others:
        lines += ["", "Unscored rows' layouts in bfloat16 without compile (memory only; float8 "
                  "and compile change it):"]
        lines += [f"- {r.row['id']} ({r.layout}): " + (
            f"{_gib(r.outcome.row['memory_per_rank_bytes'])} GiB a rank, "
            f"{'fits' if r.outcome.row['fits'] else 'does not fit'}, published "
            f"{r.row['memory_gib'] or '?'} GiB" if r.outcome.row is not None
            else r.outcome.refused) for r in others]

    unseen = [r for r in timed if r.sample == "out"]
    kinds = sorted({r.row["gpu"] for r in unseen})
    per_kind = ", ".join(f"{k}: {mape([r for r in unseen if r.row['gpu'] == k]):.1f}% over "
                         f"{sum(r.row['gpu'] == k for r in unseen)}" for k in kinds)
    pairs = apart_pairs(timed)
    fit_ok = [r for r in timed if r.outcome.row["fits"]]
    lines += ["", f"MAPE out of sample: {mape(unseen):.1f}% over {len(unseen)} rows ({per_kind})"
              if unseen else "MAPE out of sample: no row predicted",
              f"fits: {len(fit_ok)} of {len(timed)} layouts that ran judged to fit"
              + (f" ({len(refused)} rows refused)" if refused else ""),
              f"rank order: {sum(ok for *_, ok in pairs)} of {len(pairs)} clearly-apart pairs "
              f"(published tok/s/GPU more than {(APART - 1) * 100:.0f}% apart, same model and "
              "GPU kind) ordered right"]
    lines += [f"  - wrong: {a.row['id']} ({_num(a.row['tps_per_gpu']):g}) against "
              f"{b.row['id']} ({_num(b.row['tps_per_gpu']):g}); predicted {a.predicted_tps:.0f}"
              f" and {b.predicted_tps:.0f}" for a, b, ok in pairs if not ok]
    bars = [
        ("every scored row predicted (none refused, every GPU kind fitted)",
         len(timed) == len(ran) and all(f[0] is not None for f in fits.values())),
        (f"MAPE out of sample within {MAPE_BAR:g}%",
         bool(unseen) and mape(unseen) <= MAPE_BAR),
        ("every layout that ran judged to fit", len(fit_ok) == len(timed) and bool(timed)),
        ("every clearly-apart pair ordered right", all(ok for *_, ok in pairs)),
    ]
    lines += [f"- {'holds' if ok else 'FAILS'}: {what}" for what, ok in bars]
    return lines, bars


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--csv", type=Path, default=CSV)
    ap.add_argument("--fit", action="append", default=[], metavar="KIND=ROW",
                    help="fit a GPU kind's scale on another row (it is then in-sample)")
    ap.add_argument("--jobs", type=int, default=JOBS, help=f"CLI calls at once (at most {JOBS})")
    ap.add_argument("--unscored", action="store_true",
                    help="also run the unscored rows' layouts, for their memory")
    ap.add_argument("--check", action="store_true", help="exit 1 when a bar is missed")
    args = ap.parse_args(argv)
    rows = load(args.csv)
    ids = {r["id"]: r for r in rows}
    fit_rows = dict(FIT_ROWS)
    for text in args.fit:
        kind, _, row_id = text.partition("=")
        if kind not in FIT_ROWS or row_id not in ids or ids[row_id]["gpu"] != kind \
                or unscored_because(ids[row_id]):
            ap.error(f"--fit {text}: a scored {kind} row of {args.csv.name} is needed")
        fit_rows[kind] = row_id
    fits, results, others = evaluate(rows, fit_rows, args.jobs, args.unscored)
    lines, bars = report(rows, fit_rows, fits, results, others)
    print(f"torchtitan's published runs through `distbench plan` ({args.csv}: {len(rows)} "
          f"rows, {len(results)} scored or gone out of memory)")
    print("\n".join(lines))
    return 1 if args.check and not all(ok for _, ok in bars) else 0


if __name__ == "__main__":
    sys.exit(main())

"""Megatron-LM's published runs, predicted through `distbench plan`'s command line from the
declared DGX A100 fabric alone (issue 31 item 6, issue 46 items 7 and 9): nothing measured,
arithmetic only. Each row is one command line, run as a process (two at a time), and its
figures are the `given` row of the plan.csv it writes: the table below is what the CLI prints.

    python benchmarks/megatron_sc21.py [--fit 145.6B] [--table2-v 4] [--commands]

The runs: Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters
Using Megatron-LM", SC'21 (arXiv 2104.04473), Table 1 (weak scaling, 1.7B to 1T parameters)
and Table 2 (174.6B: PTD-P against ZeRO-3 without model parallelism). DGX A100 80 GB nodes, 8
GPUs on NVLink/NVSwitch, 8 x 200 Gb/s HDR InfiniBand a node, 312 TFLOP/s a GPU in 16 bits,
sequence 2048, vocabulary 51,200, every layer recomputed in backward.

Each published TFLOP/s per GPU is turned into a step time with the paper's own count of FLOPs
per iteration (its equation 3, recomputation included), 96 B s l h^2 (1 + s/6h + V/16lh), over
TFLOP/s x GPUs. Each row is predicted by

    distbench plan --fabric dgx-a100 --gpus N --model layers=..,hidden=..,heads=..,ffn=..,
        seq=2048,vocab=51200,batch=..,attention=unfused --dtype bfloat16 --trainer megatron
        --layout tp=..,pp=..,mbs=..,recompute=full,v=..,sp=0,dp_overlap=0 --mfu X --out DIR

attention unfused (Megatron before FlashAttention), no sequence parallelism (it came in 2022)
and the data-parallel all-reduce after backward, not overlapped with it (Megatron of 2021 had
no --overlap-grad-reduce). The model's one free figure, the fraction of the A100's peak a
layer's matrix math reaches (`--mfu`), is fitted on one row (--fit, named before looking) by
the secant method through the same command line, to 0.1%; that row is then in-sample and every
other row out of sample.

Table 2's ZeRO-3 rows are DeepSpeed's (2021), not Megatron's: `--trainer megatron` runs ZeRO 0
and 1 only, so they are planned as torch's FSDP2 runs ZeRO-3 with its collectives not
overlapped (`--trainer torch --layout tp=1,pp=1,zero=3,...,dp_overlap=0`) and printed
unscored. They measure DeepSpeed 2021's synchronous per-parameter gathers (docs/plan.md),
which no planner term models; only their direction is checked: the predicted TFLOP/s per GPU
falls as the GPUs double.

Where the layouts come from (NVIDIA/Megatron-LM examples/sc21, last at commit 4d1c207597,
removed later; the README names the commit that ran them, 6985e58938):
- run_table_1.sh: each Table 1 row's TP, PP, micro-batch and global batch as the paper's table;
  `--activations-checkpoint-method uniform` on every row; `--num-layers-per-virtual-pipeline-
  stage` 5 for 145.6B (80 layers / pp 8 = 10 a stage: 2 virtual stages) and 1 for 529.6B (105 /
  35 = 3: 3 virtual stages); none for 1.7B, 18.4B, 39.1B and 1T; --fp16 (the same 312 TFLOP/s
  peak as bf16 on the A100).
- Table 2's 174.6B model: 96 layers, hidden 12288, 96 heads (run_figure_12.sh, "GPT-3 175B",
  whose parameter count by the paper's formula is 174.6B). Its PTD-P layout: model-parallel
  size 96 and micro-batch 1 (the paper's Table 2), that is tp 8 x pp 12 as run_figure_12.sh and
  run_figure_18.sh run this model, interleaved with 2 layers a virtual stage (4 virtual stages),
  as those scripts do; the paper does not say whether Table 2's runs interleaved (--table2-v 1
  predicts them without). ZeRO-3: micro-batch 4, 2, 1 on 384, 768, 1536 GPUs, one micro-batch
  a step (1536 / GPUs samples a GPU).
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from distbench.core.layout_label import row_label  # noqa: E402
from distbench.core.tables import markdown_table  # noqa: E402

SOURCE = ("Narayanan et al., Efficient Large-Scale Language Model Training on GPU Clusters "
          "Using Megatron-LM, SC'21 (arXiv 2104.04473), Tables 1 and 2; layouts from "
          "NVIDIA/Megatron-LM examples/sc21 (commit 4d1c207597)")
FABRIC = "dgx-a100"
DTYPE = "bfloat16"  # the scripts ran --fp16: the same 2 bytes and the same A100 peak
PEAK_TFLOPS = 312  # the A100's dense 16-bit peak, what --mfu is a fraction of
SEQ, VOCAB = 2048, 51200
# the row the free figure is fitted on unless --fit names another: the middle of Table 1's
# range, the first row with tensor, pipeline and data parallelism and interleaving all at once
FIT_ROW = "145.6B"
# the Done-when bars (issues 31 and 46): out-of-sample Table 1 rows, Table 2's PTD-P rows, and
# PTD-P's spread of TFLOP/s per GPU as the GPUs double
TABLE1_BAR, TABLE2_BAR, PTDP_SPREAD = 15.0, 20.0, 10.0
# the fit: the fitted row's predicted step within this of its published one
FIT_TOL, FIT_MOST_CALLS = 1e-3, 8
JOBS = 2  # command lines at once (the project's machine has 2 cores, shared)
CALL_TIMEOUT_S = 300


@dataclass(frozen=True)
class Published:
    table: str
    name: str  # the paper's parameter count, and the scheme for Table 2
    heads: int
    hidden: int
    layers: int
    tp: int
    pp: int
    gpus: int
    batch: int  # global batch, samples
    micro_batch: int  # samples a micro-batch
    tflops: float  # achieved TFLOP/s per GPU, as published
    zero: int = 0
    virtual_stages: int = 1

    @property
    def scored(self) -> bool:
        """Whether the row is held to a bar: every row Megatron ran (ZeRO-3's were DeepSpeed's,
        retired: their direction only)."""
        return self.zero == 0

    @property
    def trainer(self) -> str:
        return "megatron" if self.zero == 0 else "torch"


def _t1(name, heads, hidden, layers, tp, pp, gpus_, batch, mb, tflops, v=1) -> Published:
    return Published("1", name, heads, hidden, layers, tp, pp, gpus_, batch, mb, tflops,
                     virtual_stages=v)


# Table 1: params, heads, hidden, layers, TP, PP, GPUs, global batch, micro-batch, TFLOP/s a GPU
TABLE1 = (
    _t1("1.7B", 24, 2304, 24, 1, 1, 32, 512, 16, 137),
    _t1("18.4B", 48, 6144, 40, 8, 1, 256, 1024, 8, 135),
    _t1("39.1B", 64, 8192, 48, 8, 2, 512, 1536, 4, 138),
    _t1("145.6B", 96, 12288, 80, 8, 8, 1536, 2304, 2, 148, v=2),
    _t1("529.6B", 128, 20480, 105, 8, 35, 2520, 2520, 1, 163, v=3),
    _t1("1008.0B", 160, 25600, 128, 8, 64, 3072, 3072, 1, 163),
)
# Table 2: 174.6B, global batch 1536
GPT3 = dict(heads=96, hidden=12288, layers=96, batch=1536)
TABLE2 = tuple(
    [Published("2", f"PTD-P {g}", tp=8, pp=12, gpus=g, micro_batch=1, tflops=t,
               virtual_stages=4, **GPT3)
     for g, t in ((384, 153), (768, 149), (1536, 141))]
    + [Published("2", f"ZeRO-3 {g}", tp=1, pp=1, gpus=g, micro_batch=mb, tflops=t, zero=3,
                 **GPT3)
       for g, mb, t in ((384, 4, 144), (768, 2, 88), (1536, 1, 44))])
ROWS = TABLE1 + TABLE2


def paper_flops(batch: int, seq: int, layers: int, hidden: int, vocab: int) -> float:
    """FLOPs of one iteration as the paper counts them (its equation 3): forward, backward and
    the recomputed forward of every layer, and the LM head's logits."""
    return (96 * batch * seq * layers * hidden ** 2
            * (1 + seq / (6 * hidden) + vocab / (16 * layers * hidden)))


def published_step_s(row: Published) -> float:
    """The step time a published TFLOP/s per GPU stands for."""
    flops = paper_flops(row.batch, SEQ, row.layers, row.hidden, VOCAB)
    return flops / (row.tflops * 1e12 * row.gpus)


# the command lines


def model_arg(row: Published) -> str:
    """--model: the row's shape, attention unfused as Megatron ran it in 2021."""
    return (f"layers={row.layers},hidden={row.hidden},heads={row.heads},ffn={4 * row.hidden},"
            f"seq={SEQ},vocab={VOCAB},batch={row.batch},attention=unfused")


def layout_arg(row: Published) -> str:
    """--layout: the row's layout as the scripts ran it. Megatron of 2021: every layer
    recomputed, no sequence parallelism, the DP all-reduce after backward (not overlapped).
    ZeRO-3's rows: FSDP2's ZeRO-3 (torch's trainer), its gathers not overlapped, as DeepSpeed's
    of 2021 synchronised the device before each (without, the plan hides all but 57 ms of
    their 5.5 s behind compute, and its TFLOP/s per GPU stay flat at 184 as the GPUs double)."""
    if row.zero:
        return (f"tp={row.tp},pp={row.pp},zero={row.zero},mbs={row.micro_batch},"
                "recompute=full,dp_overlap=0")
    return (f"tp={row.tp},pp={row.pp},mbs={row.micro_batch},recompute=full,"
            f"v={row.virtual_stages},sp=0,dp_overlap=0")


def mfu_arg(mfu: float) -> str:
    return f"{mfu:.6g}"


def plan_argv(row: Published, mfu: float, out: Path | str) -> list[str]:
    """The arguments after `distbench` that predict `row` at `mfu` of the A100's peak. The
    enumeration beside it weighs the row's ZeRO stage only: Megatron of 2021 had no
    distributed optimizer, and DeepSpeed's rows are ZeRO-3."""
    return ["plan", "--fabric", FABRIC, "--gpus", str(row.gpus), "--model", model_arg(row),
            "--dtype", DTYPE, "--trainer", row.trainer, "--zero", str(row.zero),
            "--layout", layout_arg(row),
            "--mfu", mfu_arg(mfu), "--out", str(out)]


def command_line(row: Published, mfu: float, out: str = "OUT") -> str:
    return shlex.join(["distbench", *plan_argv(row, mfu, out)])


# running them


Runner = Callable[[list[str]], None]


def run_cli(argv: list[str]) -> None:
    """`distbench *argv` as a process of this interpreter; its error on a non-zero exit."""
    done = subprocess.run([sys.executable, "-m", "distbench", *argv], capture_output=True,
                          text=True, timeout=CALL_TIMEOUT_S)
    if done.returncode:
        tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
        raise RuntimeError(f"distbench {shlex.join(argv)} exited {done.returncode}:\n"
                           + "\n".join(tail))


def read_given(out: Path) -> dict:
    """The `given` row of the plan.csv a `plan --out out` wrote: the named layout's figures."""
    [csv] = sorted(Path(out).glob("*/plan.csv"))
    table = pd.read_csv(csv)
    given = table[table["given"] == 1]
    if len(given) != 1:
        raise ValueError(f"{csv}: {len(given)} rows with given 1, expected one")
    return given.iloc[0].to_dict()


def predict_row(row: Published, mfu: float, run: Runner = run_cli) -> dict:
    """plan.csv's row of `row`'s layout, planned through the command line at `mfu`."""
    with tempfile.TemporaryDirectory(prefix="megatron-sc21-") as tmp:
        out = Path(tmp) / "plan"
        run([*plan_argv(row, mfu, out), "--no-plot"])  # the sweep reads plan.csv alone
        return read_given(out)


def predict_rows(rows: Sequence[Published], mfus: float | Sequence[float],
                 run: Runner = run_cli, jobs: int = JOBS) -> list[dict]:
    """predict_row of each row (at one mfu, or one each), `jobs` command lines at once."""
    mfus = [mfus] * len(rows) if isinstance(mfus, float | int) else list(mfus)
    if jobs <= 1:
        return [predict_row(r, f, run) for r, f in zip(rows, mfus, strict=True)]
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(lambda rf: predict_row(*rf, run), zip(rows, mfus, strict=True)))


def fit_mfu(row: Published, run: Runner = run_cli, jobs: int = JOBS) -> tuple[float, int]:
    """(the fraction of peak at which `row`'s predicted step is its published one to FIT_TOL,
    the command lines it took). The secant method on 1/mfu, against which the prediction is
    close to a line (compute and bubble scale with it; communication does not), from mfu 1
    and 0.5; each fraction rounded as --mfu is written, so the one returned is the one run."""
    target = published_step_s(row) * 1e3

    def misses(mfus: list[float]) -> list[float]:
        return [p["predicted_step_ms"] / target - 1
                for p in predict_rows([row] * len(mfus), mfus, run, jobs)]

    x = [1.0, 2.0]  # 1 / mfu
    f = misses([1 / v for v in x])
    calls = 2
    if f[0] > 0:
        raise ValueError(f"{row.name}: predicted {f[0]:+.1%} at the GPU's whole peak; no "
                         "fraction of it fits")
    while calls < FIT_MOST_CALLS:
        step = x[-1] - f[-1] * (x[-1] - x[-2]) / (f[-1] - f[-2])
        mfu = float(mfu_arg(1 / max(step, 1.0)))
        [miss] = misses([mfu])
        calls += 1
        if abs(miss) <= FIT_TOL:
            return mfu, calls
        x, f = [x[-1], 1 / mfu], [f[-1], miss]
    raise ValueError(f"{row.name}: the fit did not come within {FIT_TOL:.1%} in "
                     f"{FIT_MOST_CALLS} command lines")


def rows_for(table2_v: int = 4) -> tuple[Published, ...]:
    return tuple(replace(r, virtual_stages=table2_v) if r.table == "2" and r.zero == 0 else r
                 for r in ROWS)


def evaluate(fit: str = FIT_ROW, table2_v: int = 4, run: Runner = run_cli,
             jobs: int = JOBS) -> tuple[float, list[dict]]:
    """(the fitted fraction, one result per published row), every figure through the CLI."""
    rows = rows_for(table2_v)
    [fitted] = [r for r in rows if r.name == fit]
    mfu, calls = fit_mfu(fitted, run, jobs)
    out = []
    for r, p in zip(rows, predict_rows(rows, mfu, run, jobs), strict=True):
        published = published_step_s(r)
        predicted = p["predicted_step_ms"] / 1e3
        out.append({"row": r, "layout": row_label(p), "trainer": p.get("trainer", r.trainer),
                    "command": command_line(r, mfu), "published_s": published,
                    "predicted_s": predicted, "error_pct": (predicted / published - 1) * 100,
                    "predicted_tflops": r.tflops * published / predicted,
                    "in_sample": r.name == fit, "fit_calls": calls,
                    "fits": bool(int(p["fits"])),
                    "memory_gib": p["memory_per_rank_bytes"] / 2**30,
                    "limit_gib": p["memory_limit_bytes"] / 2**30,
                    "bubble_s": p["bubble_ms"] / 1e3, "tp_s": p["tp_comm_ms"] / 1e3,
                    "dp_s": p["dp_exposed_ms"] / 1e3})
    return mfu, out


# the bars


def mape(results: list[dict]) -> float:
    return sum(abs(r["error_pct"]) for r in results) / len(results) if results else 0.0


def checks(results: list[dict]) -> list[tuple[str, bool]]:
    """The Done-when bars, each (what, holds). ZeRO-3's rows only by their direction."""
    t1 = [r for r in results if r["row"].table == "1" and not r["in_sample"]]
    ptdp = [r for r in results if r["row"].table == "2" and r["row"].scored]
    zero3 = [r["predicted_tflops"] for r in results if not r["row"].scored]
    ptdp_rates = [r["predicted_tflops"] for r in ptdp]
    megatron = [r for r in results if r["row"].scored]
    return [
        (f"Table 1: every out-of-sample row within +-{TABLE1_BAR:g}%",
         all(abs(r["error_pct"]) <= TABLE1_BAR for r in t1)),
        (f"Table 2: every PTD-P row within +-{TABLE2_BAR:g}%",
         all(abs(r["error_pct"]) <= TABLE2_BAR for r in ptdp)),
        (f"Table 2: PTD-P's predicted TFLOP/s per GPU within {PTDP_SPREAD:g}% as the GPUs double",
         (max(ptdp_rates) / min(ptdp_rates) - 1) * 100 <= PTDP_SPREAD),
        ("every layout Megatron ran fits (--trainer megatron)",
         all(r["fits"] for r in megatron)),
        ("Table 2: ZeRO-3's predicted TFLOP/s per GPU falls as the GPUs double (unscored "
         "otherwise: DeepSpeed 2021's synchronous per-parameter gathers, not FSDP2's ZeRO-3)",
         all(b < a for a, b in zip(zero3, zero3[1:], strict=False))),
    ]


def table_lines(mfu: float, results: list[dict]) -> list[str]:
    head = ["table", "row", "layout", "published TFLOP/s", "published step (s)",
            "predicted step (s)", "error", "predicted TFLOP/s", "bubble (s)", "TP (s)",
            "DP exposed (s)", "memory (GiB)", "fits", "sample"]
    cells = [[r["row"].table, r["row"].name, r["layout"], f"{r['row'].tflops:g}",
              f"{r['published_s']:.2f}", f"{r['predicted_s']:.2f}",
              f"{r['error_pct']:+.1f}%" if r["row"].scored else f"({r['error_pct']:+.1f}%)",
              f"{r['predicted_tflops']:.0f}", f"{r['bubble_s']:.2f}", f"{r['tp_s']:.2f}",
              f"{r['dp_s']:.2f}", f"{r['memory_gib']:.1f}", "yes" if r["fits"] else "no",
              "in" if r["in_sample"] else ("out" if r["row"].scored else "unscored")]
             for r in results]
    limit = results[0]["limit_gib"]
    out = [f"distbench plan --fabric {FABRIC} --dtype {DTYPE} --trainer megatron (ZeRO-3: "
           f"torch); a layer's matrix math at --mfu {mfu_arg(mfu)} of the A100's "
           f"{PEAK_TFLOPS} TFLOP/s ({mfu * PEAK_TFLOPS:.1f}), fitted on the row marked in "
           f"({results[0].get('fit_calls', '?')} command lines, to {FIT_TOL:.1%}); memory per "
           f"rank against {limit:.1f} GiB usable", ""]
    out += markdown_table(head, cells, "llcrrrrrrrrrll")
    scored = [r for r in results if not r["in_sample"] and r["row"].scored]
    unscored = [r for r in results if not r["row"].scored]
    out += ["", f"MAPE out of sample: {mape(scored):.1f}% over {len(scored)} rows "
            f"(Table 1: {mape([r for r in scored if r['row'].table == '1']):.1f}%, Table 2's "
            f"PTD-P: {mape([r for r in scored if r['row'].table == '2']):.1f}%); ZeRO-3, "
            f"unscored: {mape(unscored):.1f}% (in parentheses)"]
    out += [f"- {'holds' if ok else 'FAILS'}: {what}" for what, ok in checks(results)]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fit", default=FIT_ROW, choices=[r.name for r in ROWS if r.scored],
                    help="the row the fraction of peak is fitted on (in-sample)")
    ap.add_argument("--table2-v", type=int, default=4, choices=(1, 2, 4, 8),
                    help="virtual stages of Table 2's PTD-P runs (the paper does not say)")
    ap.add_argument("--commands", action="store_true",
                    help="print each row's command line too")
    args = ap.parse_args(argv)
    mfu, results = evaluate(args.fit, args.table2_v)
    print("\n".join(table_lines(mfu, results)))
    if args.commands:
        print("\ncommand lines:")
        print("\n".join(r["command"] for r in results))
    print(f"\nsource: {SOURCE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

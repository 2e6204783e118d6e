"""Megatron-LM's published runs, predicted by `distbench plan`'s model from the declared DGX A100
fabric alone (issue 31, item 6): nothing measured, arithmetic only.

    python benchmarks/megatron_sc21.py [--fit 145.6B] [--markdown]

The runs: Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters
Using Megatron-LM", SC'21 (arXiv 2104.04473), Table 1 (weak scaling, 1.7B to 1T parameters)
and Table 2 (174.6B: PTD-P against ZeRO-3 without model parallelism). DGX A100 80 GB nodes, 8
GPUs on NVLink/NVSwitch, 8 x 200 Gb/s HDR InfiniBand a node, 312 TFLOP/s a GPU in 16 bits,
sequence 2048, vocabulary 51,200, every layer recomputed in backward.

Each published TFLOP/s per GPU is turned into a step time with the paper's own count of FLOPs
per iteration (its equation 3, recomputation included), 96 B s l h^2 (1 + s/6h + V/16lh), over
TFLOP/s x GPUs. Each row becomes a ModelSpec and a Layout (dp = GPUs / (tp pp), micro-batch
size -> micro-batches per replica, ZeRO 0 for PTD-P and 3 for the ZeRO rows, recomputation
full, interleaved virtual stages where the paper's scripts use them) and is predicted by
planner.plan.make_plan on the inputs `plan --fabric dgx-a100` builds (planner.fabrics.declare,
planner.gpus.synthesize). The model's one free figure, the fraction of the A100's peak a
layer's matrix math reaches (`--mfu`), is fitted on one row (--fit), which is then in-sample;
every other row is out of sample.

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
import sys
from dataclasses import dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from distbench.core.tables import markdown_table  # noqa: E402
from distbench.planner import fabrics, gpus  # noqa: E402
from distbench.planner.inputs import Inputs  # noqa: E402
from distbench.planner.layouts import Layout, problems  # noqa: E402
from distbench.planner.models import ModelSpec  # noqa: E402
from distbench.planner.plan import compute_shapes, make_plan  # noqa: E402

SOURCE = ("Narayanan et al., Efficient Large-Scale Language Model Training on GPU Clusters "
          "Using Megatron-LM, SC'21 (arXiv 2104.04473), Tables 1 and 2; layouts from "
          "NVIDIA/Megatron-LM examples/sc21 (commit 4d1c207597)")
FABRIC = "dgx-a100"
DTYPE = "bfloat16"  # the scripts ran --fp16: the same 2 bytes and the same A100 peak
SEQ, VOCAB = 2048, 51200
# the row the free figure is fitted on unless --fit names another: the middle of Table 1's
# range, the first row with tensor, pipeline and data parallelism and interleaving all at once
FIT_ROW = "145.6B"
# the Done-when bars (issue 31): out-of-sample Table 1 rows, every Table 2 row, and PTD-P's
# spread of TFLOP/s per GPU as the GPUs double
TABLE1_BAR, TABLE2_BAR, PTDP_SPREAD = 15.0, 20.0, 10.0


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


def model_of(row: Published) -> ModelSpec:
    return ModelSpec(name=f"megatron-{row.name.split()[0].lower()}", layers=row.layers,
                     hidden_size=row.hidden, ffn_size=4 * row.hidden, heads=row.heads,
                     seq_len=SEQ, batch=row.batch, vocab=VOCAB, fused_attention=False)


def layout_of(row: Published) -> Layout:
    dp = row.gpus // (row.tp * row.pp)
    return Layout(tp=row.tp, pp=row.pp, dp=dp, zero=row.zero,
                  micro_batches=row.batch // (dp * row.micro_batch), recompute="full",
                  virtual_stages=row.virtual_stages)


def predict_row(row: Published, mfu: float) -> dict:
    """plan.csv's row of `row`'s layout on the declared fabric, compute at `mfu` of the GPU's
    peak: what `plan --fabric dgx-a100 --mfu MFU --dtype bfloat16` computes for it."""
    model, layout = model_of(row), layout_of(row)
    wrong = problems(layout, model, 8)
    if wrong:
        raise ValueError(f"{row.name}: {'; '.join(wrong)}")
    fabric = fabrics.PRESETS[FABRIC]
    inputs = fabrics.declare(Inputs(), fabric)
    gpu = gpus.GPUS[fabric.gpu]
    gpus.synthesize(inputs, model, gpu, mfu, DTYPE, compute_shapes(model, [layout]))
    [predicted] = make_plan(model, inputs, row.gpus, fabric.gpus_per_node, gpu.memory_bytes,
                            DTYPE, layouts=[layout])
    return predicted


def fit_mfu(row: Published) -> float:
    """The fraction of peak at which `row`'s predicted step equals its published one: the
    prediction is A / mfu + B (compute and bubble scale with 1 / mfu; communication does not)."""
    at1 = predict_row(row, 1.0)["predicted_step_ms"]
    at_half = predict_row(row, 0.5)["predicted_step_ms"]
    a, b = at_half - at1, 2 * at1 - at_half
    return a / (published_step_s(row) * 1e3 - b)


def evaluate(fit: str = FIT_ROW, table2_v: int = 4) -> tuple[float, list[dict]]:
    """(the fitted fraction, one result per published row)."""
    rows = [replace(r, virtual_stages=table2_v) if r.table == "2" and r.zero == 0 else r
            for r in ROWS]
    [fitted] = [r for r in rows if r.name == fit]
    mfu = fit_mfu(fitted)
    out = []
    for r in rows:
        p = predict_row(r, mfu)
        published = published_step_s(r)
        predicted = p["predicted_step_ms"] / 1e3
        out.append({"row": r, "layout": layout_of(r).label(), "published_s": published,
                    "predicted_s": predicted, "error_pct": (predicted / published - 1) * 100,
                    "predicted_tflops": r.tflops * published / predicted,
                    "in_sample": r.name == fit, "fits": p["fits"],
                    "bubble_s": p["bubble_ms"] / 1e3, "tp_s": p["tp_comm_ms"] / 1e3,
                    "dp_s": p["dp_exposed_ms"] / 1e3})
    return mfu, out


def mape(results: list[dict]) -> float:
    return sum(abs(r["error_pct"]) for r in results) / len(results)


def checks(results: list[dict]) -> list[tuple[str, bool]]:
    """The issue's Done-when bars, each (what, holds)."""
    t1 = [r for r in results if r["row"].table == "1" and not r["in_sample"]]
    t2 = [r for r in results if r["row"].table == "2"]
    zero3 = [r["predicted_tflops"] for r in t2 if r["row"].zero == 3]
    ptdp = [r["predicted_tflops"] for r in t2 if r["row"].zero == 0]
    return [
        (f"Table 1: every out-of-sample row within +-{TABLE1_BAR:g}%",
         all(abs(r["error_pct"]) <= TABLE1_BAR for r in t1)),
        (f"Table 2: every row within +-{TABLE2_BAR:g}%",
         all(abs(r["error_pct"]) <= TABLE2_BAR for r in t2)),
        ("Table 2: ZeRO-3's predicted TFLOP/s per GPU falls as the GPUs double",
         all(b < a for a, b in zip(zero3, zero3[1:], strict=False))),
        (f"Table 2: PTD-P's predicted TFLOP/s per GPU within {PTDP_SPREAD:g}% as the GPUs double",
         (max(ptdp) / min(ptdp) - 1) * 100 <= PTDP_SPREAD),
    ]


def table_lines(mfu: float, results: list[dict]) -> list[str]:
    head = ["table", "row", "layout", "published TFLOP/s", "published step (s)",
            "predicted step (s)", "error", "predicted TFLOP/s", "bubble (s)", "TP (s)",
            "DP exposed (s)", "fits", "sample"]
    cells = [[r["row"].table, r["row"].name, r["layout"], f"{r['row'].tflops:g}",
              f"{r['published_s']:.2f}", f"{r['predicted_s']:.2f}", f"{r['error_pct']:+.1f}%",
              f"{r['predicted_tflops']:.0f}", f"{r['bubble_s']:.2f}", f"{r['tp_s']:.2f}",
              f"{r['dp_s']:.2f}", "yes" if r["fits"] else "no",
              "in" if r["in_sample"] else "out"] for r in results]
    out = [f"--fabric {FABRIC}, {DTYPE}; a layer's matrix math at {mfu:.4f} of the A100's "
           f"312 TFLOP/s ({mfu * 312:.1f}), fitted on the row marked in", ""]
    out += markdown_table(head, cells, "llcrrrrrrrrll")
    unseen = [r for r in results if not r["in_sample"]]
    out += ["", f"MAPE out of sample: {mape(unseen):.1f}% over {len(unseen)} rows "
            f"(Table 1: {mape([r for r in unseen if r['row'].table == '1']):.1f}%, Table 2: "
            f"{mape([r for r in unseen if r['row'].table == '2']):.1f}%)"]
    out += [f"- {'holds' if ok else 'FAILS'}: {what}" for what, ok in checks(results)]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fit", default=FIT_ROW, choices=[r.name for r in ROWS],
                    help="the row the fraction of peak is fitted on (in-sample)")
    ap.add_argument("--table2-v", type=int, default=4, choices=(1, 2, 4, 8),
                    help="virtual stages of Table 2's PTD-P runs (the paper does not say)")
    args = ap.parse_args(argv)
    mfu, results = evaluate(args.fit, args.table2_v)
    print("\n".join(table_lines(mfu, results)))
    print(f"\nsource: {SOURCE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Compute scaled from a named GPU, when no layer was timed: one layer's FLOPs over the GPU's
datasheet peak times the fraction of it a training step reaches (--mfu). A stated assumption,
not a measurement: every plan that uses it says so in its notes. Torch-free."""

from __future__ import annotations

from dataclasses import dataclass

from distbench.core.dtypes import element_bytes
from distbench.planner.inputs import ComputePoint, Inputs
from distbench.planner.models import ModelSpec

# The share of the peak a dense transformer step reaches: Megatron-LM reports 0.4 to 0.55 model
# FLOPs utilisation at these sizes (Narayanan et al. 2021, table 1); --mfu sets another.
DEFAULT_MFU = 0.5


@dataclass(frozen=True)
class Measured:
    """What distbench measured on one such GPU itself, in half precision: used in place of the
    assumed fraction of the datasheet peak and of an optimizer counted as free."""

    layer_fraction: float  # of the 16-bit peak, one layer's forward and backward
    optimizer_us_per_param: float  # the step's AdamW (fused, float32 masters), per parameter
    optimizer_us_per_layer: float  # and per layer (its launches)
    source: str


@dataclass(frozen=True)
class GPU:
    name: str
    tflops_16: float  # dense bf16/fp16 tensor-core peak
    tflops_32: float  # fp32 without TF32 (torch's default for float32 matmuls)
    memory_bytes: int
    matches: tuple[str, ...]  # substrings of NVML's name (topo.json)
    hbm_gbps: float = 0.0  # memory bandwidth, GB/s: memory-bound work (unfused attention's scores)
    measured: Measured | None = None


# benchmarks/gpu_first_contact.sh's plan item on the first H100 lent
# (docs/measurements/gpu-first-contact.md): a layer of hidden 2048, ffn 8192, 16 heads, 16,384
# tokens in bfloat16 took 10.69 ms for 5.77 TFLOP, 540 TFLOP/s; the step's AdamW 34.9 us a
# layer + 15.3 ps a parameter
H100_MEASURED = Measured(
    layer_fraction=0.546, optimizer_us_per_param=15.27e-6, optimizer_us_per_layer=34.9,
    source="measured by distbench on one H100 80GB HBM3 (torch 2.11, 2026-11-26): a 2048-wide "
           "layer at 16,384 tokens reached 540 TFLOP/s, 0.546 of the bf16 peak")


# Dense (no sparsity) peaks from NVIDIA's datasheets: A100 SXM4 80GB (A100 datasheet, 312 bf16,
# 19.5 fp32), H100 SXM5 (H100 datasheet, 989 bf16 dense = 1,979 with sparsity / 2, 67 fp32),
# H200 SXM (H200 datasheet, same compute as H100 SXM, 141 GB HBM3e), B200 (HGX B200 datasheet,
# 8 GPUs: 36 PFLOPS bf16 with sparsity, 600 TFLOPS fp32, 1.44 TB: per GPU 2,250 dense, 75,
# 180 GB). Memory as the datasheets state it, in decimal GB, and its bandwidth: A100 80GB SXM
# 2,039 GB/s, H100 SXM 3.35 TB/s, H200 4.8 TB/s, B200 8 TB/s (HGX B200: 64 TB/s for 8).
GPUS: dict[str, GPU] = {g.name: g for g in (
    GPU("a100", 312.0, 19.5, 80 * 10**9, ("A100",), hbm_gbps=2039.0),
    GPU("h100", 989.0, 67.0, 80 * 10**9, ("H100",), hbm_gbps=3350.0, measured=H100_MEASURED),
    GPU("h200", 989.0, 67.0, 141 * 10**9, ("H200",), hbm_gbps=4800.0),
    GPU("b200", 2250.0, 75.0, 180 * 10**9, ("B200",), hbm_gbps=8000.0),
)}


def peak_tflops(gpu: GPU, dtype: str) -> float:
    """The peak for `dtype`; LookupError for one the table has no figure for."""
    if dtype in ("bfloat16", "float16"):
        return gpu.tflops_16
    if dtype == "float32":
        return gpu.tflops_32
    raise LookupError(f"no {dtype} peak for {gpu.name} in the table (bfloat16, float16, "
                      "float32)")


def by_device_name(device: str) -> GPU | None:
    """The table's GPU whose NVML name `device` is (topo.json's), or None."""
    upper = device.upper()
    for gpu in GPUS.values():
        if any(m in upper for m in gpu.matches):
            return gpu
    return None


def synthesize(inputs: Inputs, model: ModelSpec, gpu: GPU, mfu: float | None, dtype: str,
               shapes: set[tuple[int, int]]) -> None:
    """ComputePoints for each (tp, tokens) in `shapes` from FLOPs / (peak x mfu), and the
    scaling stated in the notes. `mfu` None: the fraction distbench measured on this GPU in
    half precision, else DEFAULT_MFU. The optimizer, where none was measured, from what was
    measured on this GPU. Raises LookupError (a dtype the table has no peak for)."""
    peak = peak_tflops(gpu, dtype)
    measured = gpu.measured if dtype in ("bfloat16", "float16") else None
    if mfu is None and measured:
        mfu, why = measured.layer_fraction, f"{measured.layer_fraction:g}, {measured.source}"
    else:
        mfu = DEFAULT_MFU if mfu is None else mfu
        why = f"an assumed mfu of {mfu:g}"
    rate = peak * 1e12 * mfu / 1e6  # FLOPs per microsecond
    source = f"--gpu {gpu.name}: {peak:g} TFLOPS {dtype} peak x {mfu:g}"
    elt = element_bytes(dtype)
    for tp, tokens in sorted(shapes):
        flops = model.flops_per_layer(tokens, tp)
        # unfused attention's passes over its scores run at the memory's speed, not the peak's
        moved = model.score_bytes(tokens, tp, elt) / (gpu.hbm_gbps * 1e3) if gpu.hbm_gbps else 0.0
        inputs.compute.append(ComputePoint(tp=tp, tokens=tokens, layer_us=flops / rate + moved,
                                           flops=flops, source=source))
    inputs.compute_model = model.layer_shape()
    inputs.note(f"compute not measured: each layer's time is its FLOPs over {gpu.name}'s "
                f"datasheet peak ({peak:g} TFLOPS {dtype}) x {why}")
    if not model.fused_attention:
        inputs.note(f"unfused attention: each layer's passes over its scores added at "
                    f"{gpu.name}'s datasheet memory bandwidth ({gpu.hbm_gbps:g} GB/s)")
    if measured and inputs.optimizer_us_per_param is None:
        inputs.optimizer_us_per_param = measured.optimizer_us_per_param
        inputs.optimizer_us_per_layer = measured.optimizer_us_per_layer
        inputs.note(f"optimizer step: {measured.optimizer_us_per_layer:g} us a layer + "
                    f"{measured.optimizer_us_per_param * 1e6:g} ps a parameter, "
                    f"{measured.source}")

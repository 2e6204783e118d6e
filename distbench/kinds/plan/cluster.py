"""The cluster a plan is for, from the options and what the --from runs say: how many GPUs, how
many a node, and the memory each holds, each with where it came from; the fabric declared and
the GPU planned for; the layouts the user names on it. Torch-free: plan's options check them
here, and both plan pipelines size the cluster here."""

from __future__ import annotations

from typing import TYPE_CHECKING

from distbench.core.options import OptionError
from distbench.core.sizes import format_size
from distbench.planner.gpus import GPUS
from distbench.planner.models import parse_model

if TYPE_CHECKING:
    from distbench.planner.inputs import Inputs

# What a GPU is taken to hold when nothing says: an 80 GB part (A100/H100), said in the output.
ASSUMED_MEMORY = 80 * 2**30


def above_reserve(option_name: str, size: float, example: str, where: str = "") -> None:
    """A GPU's memory must leave some after the planner's reserve: at or below it, every layout
    was judged against a negative figure ("-2.0 GiB usable")."""
    from distbench.planner.memory import RESERVE_MIN_BYTES, usable_bytes

    if usable_bytes(size) <= 0:
        raise OptionError(option_name, f"{where}{format_size(int(size))} per GPU leaves nothing "
                          f"after the reserve of at least {RESERVE_MIN_BYTES / 2**30:g} GiB "
                          "kept for the CUDA context, the allocator and NCCL: give more than "
                          "that", example)


def memory_per_gpu(opts, inputs: Inputs) -> tuple[int, str]:
    """Memory per GPU and where it came from."""
    if opts.gpu_memory is not None:
        return opts.gpu_memory, "--gpu-memory"
    if inputs.memory_per_gpu:
        above_reserve("--from", inputs.memory_per_gpu, "--gpu-memory 80G",
                      "the runs' topology says ")
        return int(inputs.memory_per_gpu), "the --from topology"
    gpu = target_gpu(opts)
    if gpu is not None:
        return GPUS[gpu].memory_bytes, (
            f"--gpu {opts.gpu}'s datasheet" if opts.gpu else
            f"--fabric {opts.fabric}'s {gpu}, its datasheet")
    from distbench.planner.gpus import by_device_name

    named = by_device_name(inputs.device) if inputs.device else None
    if named is not None:
        return named.memory_bytes, f"the --from runs' {named.name}, its datasheet"
    return ASSUMED_MEMORY, ("assumed: no --gpu-memory, no GPU in the --from topology and no "
                            "--gpu")


def cluster(opts, inputs: Inputs) -> tuple[int, int, str]:
    """GPUs, GPUs per node and where the second came from."""
    if opts.gpus is None:
        raise OptionError("--gpus", "needed with --from or --fabric and no workers: how many "
                          "GPUs to plan for", "--gpus 1024 --gpus-per-node 8")
    if opts.gpus_per_node is not None:
        per_node, per_node_from = opts.gpus_per_node, "--gpus-per-node"
    elif inputs.fabric is not None and inputs.fabric.gpus_per_node:
        per_node, per_node_from = inputs.fabric.gpus_per_node, f"--fabric {opts.fabric}"
    elif inputs.device == "cpu" and inputs.gpus_per_node:
        # a CPU run's workers per node: how many processes shared its cores, not its GPUs
        raise OptionError("--gpus-per-node", f"the --from runs were measured on the CPU: their "
                          f"{inputs.gpus_per_node} workers a node are no GPU node size: say how "
                          "many GPUs a node has", "--gpus-per-node 8")
    elif inputs.gpus_per_node is None:
        # say what is missing: a fabric's figures with no --from blamed "the --from runs"
        missing = [f"--fabric {opts.fabric} gives no gpus_per_node="] if opts.fabric else []
        if opts.sources:
            missing.insert(0, "the --from runs' topology lists no GPUs")
        raise OptionError("--gpus-per-node", f"{' and '.join(missing) or 'nothing says'}: say "
                          "how many GPUs a node has, with --gpus-per-node"
                          + (" or the fabric's gpus_per_node=" if opts.fabric else ""),
                          "--gpus-per-node 8")
    else:
        per_node, per_node_from = inputs.gpus_per_node, "the --from runs'"
    check_nodes(opts.gpus, per_node)
    return opts.gpus, per_node, per_node_from


def check_nodes(gpus: int, per_node: int) -> None:
    """Up to one node, any count (a part of one node); past one, whole nodes."""
    if gpus > per_node and gpus % per_node:
        raise OptionError("--gpus", f"{gpus} GPUs are more than one node of {per_node} "
                          "(--gpus-per-node) and not whole nodes: a plan takes a part of "
                          "one node, or whole nodes", "--gpus 1024 --gpus-per-node 8")


def named_layouts(opts, gpus: int, per_node: int):
    """The --layout layouts on this cluster (planner.given); raises OptionError."""
    from distbench.planner import given

    return given.resolve_all(opts.layouts, parse_model("--model", opts.model), gpus, per_node,
                             trainer=opts.trainer)


def pure(opts) -> bool:
    """Arithmetic on earlier runs or a declared fabric only: no worker to start."""
    return ((bool(opts.sources) or opts.fabric is not None) and opts.workers is None
            and not opts.validations)


def fabric_spec(opts):
    from distbench.planner import fabrics

    return None if opts.fabric is None else fabrics.parse("--fabric", opts.fabric)


def target_gpu(opts) -> str | None:
    """The GPU planned for: --gpu, else the declared fabric's."""
    fabric = fabric_spec(opts)
    return opts.gpu or (fabric.gpu if fabric is not None else None)

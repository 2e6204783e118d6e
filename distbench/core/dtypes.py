"""The element types: the names the options accept, their aliases, and each one's size in
bytes, torch-free, so that options, accept's plan, nccl-tests logs and the ZeRO closed forms
size buffers without loading torch. ops/torch_dtypes.py maps the same names to torch dtypes."""

from __future__ import annotations

ALIASES = {
    "float32": "float32", "fp32": "float32", "float": "float32",
    "float16": "float16", "fp16": "float16", "half": "float16",
    "bfloat16": "bfloat16", "bf16": "bfloat16",
    "float64": "float64", "fp64": "float64", "double": "float64",
    "int32": "int32", "int": "int32",
    "int64": "int64", "long": "int64",
    "int8": "int8",
    "uint8": "uint8",
}
NAMES = tuple(dict.fromkeys(ALIASES.values()))
FLOATS = ("float32", "bfloat16", "float16", "float64")
# Beyond NAMES: the types an nccl-tests log may name (kept as printed there).
ELEMENT_BYTES = {
    "int8": 1, "uint8": 1, "f8e4m3": 1, "f8e5m2": 1, "float16": 2, "bfloat16": 2,
    "float32": 4, "int32": 4, "uint32": 4, "float64": 8, "int64": 8, "uint64": 8,
}


def element_bytes(name: str) -> int:
    """One element of `name` (a name of NAMES, aliases resolved), in bytes."""
    return ELEMENT_BYTES[name]

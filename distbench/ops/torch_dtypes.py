"""The dtype names the options accept (distbench.core.dtypes.NAMES), as torch dtypes. Their
sizes are core.dtypes.element_bytes: one table, no torch needed."""

from __future__ import annotations

import torch

TORCH_DTYPES = {
    "float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
    "float64": torch.float64, "int32": torch.int32, "int64": torch.int64, "int8": torch.int8,
    "uint8": torch.uint8,
}

"""distbench installs where the GPUs are: a wheel builds (for a cluster's own environment, next
to the torch its workloads use) and carries the acceptance profiles; run.json says which torch
and NCCL ran, and from where. The tests that start processes: test_packaging_multiproc.py."""

from __future__ import annotations

from pathlib import Path

import torch

from distbench.run.runtime import Runtime, loaded_library


def test_run_json_says_which_torch_ran_and_from_where():
    rt = Runtime(0, 1, 0, "gloo", torch.device("cpu"))
    versions = rt.versions()
    assert versions["torch"] == torch.__version__
    assert Path(versions["torch_path"], "__init__.py").is_file()
    assert versions["nccl"] is None and versions["nccl_library"] is None  # gloo: no NCCL
    found = loaded_library("libtorch_cpu")  # the scan of this process's libraries works
    assert found and Path(found).is_file() and found.startswith(versions["torch_path"])

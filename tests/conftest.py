import pytest
from helpers import LAUNCHER_VARS

import distbench.launch


@pytest.fixture
def captured(monkeypatch, tmp_path):
    """Run the CLI in-process with dispatch replaced; returns the (command, opts) it was given."""
    for var in LAUNCHER_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)  # the default --out is relative
    seen: list[tuple[str, object]] = []

    def fake_dispatch(command, opts):
        seen.append((command, opts))
        return 0

    monkeypatch.setattr(distbench.launch, "dispatch", fake_dispatch)
    return seen

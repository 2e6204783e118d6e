import signal
import time

import pytest
from helpers import LAUNCHER_VARS, free_port, processes_naming

import distbench.cli.app

# A suite started in the background by a shell without job control (a CI script's `cmd &`)
# inherits SIGINT ignored, and so would every process it starts, since an ignored signal
# survives exec: the Ctrl-C tests need SIGINT as a terminal delivers it. A handler does not
# survive exec, so the processes the tests start get the default again.
signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="module")
def one_rank_group():
    """A one-rank gloo process group in the test process, for one module's tests."""
    import torch.distributed as dist

    if dist.is_initialized():
        pytest.skip("a process group already exists in this process")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0,
                            world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


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

    monkeypatch.setattr(distbench.cli.app, "dispatch", fake_dispatch)
    return seen


@pytest.fixture(autouse=True)
def no_orphans(request):
    """Every process a test started under its tmp_path (launchers, workers, torchrun agents) is
    gone soon after the test: none survives to run on, or to report on a run that ended."""
    if "tmp_path" not in request.fixturenames:
        yield
        return
    tmp_path = request.getfixturevalue("tmp_path")
    yield
    deadline = time.monotonic() + 15
    while processes_naming(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert processes_naming(tmp_path) == [], f"processes outlived the test under {tmp_path}"

import functools
import multiprocessing.process
import platform
import signal
import subprocess
import time
from pathlib import Path

import helpers
import pytest
from helpers import free_port, processes_naming
from paths import TESTS

# A suite started in the background by a shell without job control (a CI script's `cmd &`)
# inherits SIGINT ignored, and so would every process it starts, since an ignored signal
# survives exec: the Ctrl-C tests need SIGINT as a terminal delivers it. A handler does not
# survive exec, so the processes the tests start get the default again.
signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_configure(config):
    """Every process a test starts is counted against the suite's budget (helpers.processes):
    subprocess and multiprocessing (torch's mp.spawn) ask first."""
    popen_init = subprocess.Popen.__init__
    process_start = multiprocessing.process.BaseProcess.start

    def init(self, args, *rest, **kwargs):
        helpers.check_may_start(repr(args)[:120])
        popen_init(self, args, *rest, **kwargs)

    def start(self):
        helpers.check_may_start(f"multiprocessing {self.name}")
        process_start(self)

    subprocess.Popen.__init__ = init
    multiprocessing.process.BaseProcess.start = start
    # run.json records the CPU, which Python learns once per process from `uname -p`: learnt
    # here, before any test, the in-process tests that write one start nothing
    platform.processor()
    # matplotlib builds its font cache on first use with `fc-list`: built here, the in-process
    # tests that draw a plot (plan's) start nothing on a fresh machine either
    import matplotlib.font_manager  # noqa: F401


def pytest_collection_modifyitems(config, items):
    """procs(n) implies multiproc, every test is in the folder of its kind
    (misplaced_because), and a clock test's module says so (clock_unseen_because): one in the
    wrong place stops the run before any test, naming it. The
    order is pytest-xdist's: whole modules (--dist loadfile,
    so a module's fixtures run once), the ones with the most tests first. It overrode the
    longest-first order this hook used to make, and that order, made to count
    (--no-loadscope-reorder, 5 s a multi-process test as a fresh clone guesses), was no faster:
    487 s at three pytest processes, against 442 and 465 s in xdist's order."""
    misplaced = []
    for item in items:
        if item.get_closest_marker("procs") and not item.get_closest_marker("multiproc"):
            item.add_marker(pytest.mark.multiproc)
        why = misplaced_because(item) or clock_unseen_because(item)
        if why:
            misplaced.append(f"{item.nodeid}: {why}")
            item.add_marker(pytest.mark.misplaced(why))
    # a pytest-xdist worker's UsageError reaches the terminal as an INTERNALERROR without its
    # message: there each misplaced test fails at its setup instead, naming itself
    if misplaced and not hasattr(config, "workerinput"):
        raise pytest.UsageError(
            "tests in the wrong place (docs/testing.md, \"Where a test goes\"):\n  "
            + "\n  ".join(misplaced))


def pytest_runtest_setup(item):
    misplaced = item.get_closest_marker("misplaced")
    if misplaced:
        pytest.fail(f"{item.nodeid} is in the wrong place: {misplaced.args[0]}", pytrace=False)


# How a test module marks a test clock, in its text (pytest_ignore_collect reads no other)
CLOCK_MARK = "pytest.mark.clock"


@functools.cache
def says_clock(module: Path) -> bool:
    return CLOCK_MARK in module.read_text(encoding="utf-8")


def pytest_ignore_collect(collection_path, config):
    """`-m clock` alone (make test-fast's process beside the others) imports only the test
    modules that mark a test clock: importing every module cost that process 4 of its 6
    CPU-seconds, on a core the others compute on. pytest_collection_modifyitems holds every
    clock test to a module that says so."""
    if (config.getoption("markexpr") == "clock" and collection_path.suffix == ".py"
            and collection_path.name.startswith("test_") and not says_clock(collection_path)):
        return True
    return None


def misplaced_because(item) -> str | None:
    """Why `item` is in the wrong folder, or None: a test that starts a process (marked
    multiproc, or procs(n)) lives under tests/multiproc/<area>/, every other under
    tests/unit/<area>/, so that `make test-fast` (tests/unit) starts no process and the folder
    says which kind a test is."""
    try:
        top = item.path.relative_to(TESTS).parts[0]
    except ValueError:
        return None  # not one of the suite's own modules
    multiproc = item.get_closest_marker("multiproc") is not None
    if top == "unit" and multiproc:
        return ("marked multiproc (it starts processes) but under tests/unit/: move it to "
                "tests/multiproc/<area>/")
    if top == "multiproc" and not multiproc:
        return ("not marked multiproc but under tests/multiproc/: mark it, or move it to "
                "tests/unit/<area>/")
    if top not in ("unit", "multiproc"):
        return "outside tests/unit/ and tests/multiproc/: put it in tests/<kind>/<area>/"
    return None


def clock_unseen_because(item) -> str | None:
    """Why `make test-fast` would run clock test `item` in neither of its pytest processes, or
    None: one deselects it (-m "not clock"), and the other reads only modules that say
    CLOCK_MARK (pytest_ignore_collect)."""
    if item.get_closest_marker("clock") is None or says_clock(item.path):
        return None
    return f"marked clock where its module does not say `{CLOCK_MARK}`: mark it there"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    procs = item.get_closest_marker("procs")
    with helpers.running_test(item.nodeid, item.get_closest_marker("multiproc") is not None,
                              procs.args[0] if procs else 0,
                              item.get_closest_marker("alone") is not None):
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    report = (yield).get_result()
    if call.when == "teardown":
        report.user_properties.append(("waited_s", helpers.waited()))


WAITED: dict[str, float] = {}


def pytest_runtest_logreport(report):
    if report.when == "teardown":
        WAITED[report.nodeid] = dict(report.user_properties).get("waited_s", 0.0)


def pytest_terminal_summary(terminalreporter, config):
    """Beside --durations, which count a test's waits for process slots (and for an `alone`
    test) as its own time: the tests that waited longest."""
    waits = sorted(((s, n) for n, s in WAITED.items() if s >= 1), reverse=True)
    if config.getoption("durations", None) is not None and waits:
        terminalreporter.section("longest waits for process slots (part of the durations)")
        for secs, nodeid in waits[:10]:
            terminalreporter.write_line(f"{secs:.2f}s waited {nodeid}")


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
def in_process(tmp_path):
    """helpers.cli in this test's tmp_path: `distbench *argv` run here, nothing started."""
    return lambda *argv: helpers.cli(tmp_path, *argv)


@pytest.fixture(autouse=True)
def no_orphans(request):
    """Every process a test started under its tmp_path (launchers, workers, torchrun agents) is
    gone soon after the test: none survives to run on, or to report on a run that ended."""
    # a test not marked multiproc starts no process (helpers.check_may_start): nothing to look for
    if "tmp_path" not in request.fixturenames or \
            request.node.get_closest_marker("multiproc") is None:
        yield
        return
    tmp_path = request.getfixturevalue("tmp_path")
    yield
    deadline = time.monotonic() + 15
    while processes_naming(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert processes_naming(tmp_path) == [], f"processes outlived the test under {tmp_path}"

"""The progress bar on a terminal: step's layouts (and tp's blocks and dp's modes, written by
the same steps.common.write_rows) each a step of it, named as it runs, with the time left at the
pace so far. plan's stages are drawn the same way (kinds/plan/workers.py)."""

from __future__ import annotations

import io
import re
from types import SimpleNamespace

from fake_session import FakeSession
from rich.console import Console as RichConsole

from distbench.kinds.step import output as step_output
from distbench.results.writer import NullSink
from distbench.run.console import Console, Eta
from distbench.steps.common import write_rows


def _on_a_terminal() -> tuple[Console, io.StringIO]:
    console = Console(True)
    screen = io.StringIO()
    console.err = RichConsole(file=screen, force_terminal=True, width=120, highlight=False)
    return console, screen


def _frames(screen: io.StringIO) -> list[str]:
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", screen.getvalue())
    return [" ".join(f.replace("━", " ").replace("╸", " ").replace("╺", " ").split())
            for f in re.split(r"[\r\n]", text) if f.strip()]


def test_each_layout_is_a_step_of_the_bar_named_as_it_runs():
    console, screen = _on_a_terminal()
    session = FakeSession(console=console, command="step")
    seen = []

    def layout(label):
        def measure(bad):
            seen.append(_frames(screen)[-1])  # what the terminal shows while it runs
            return {"status": "ok"}, {}
        return label, measure

    labels = ["tp1 pp1 dp2", "tp1 pp2 dp1", "tp2 pp1 dp1"]
    assert write_rows(session, NullSink(), step_output.OUTPUT, {"layouts": {}}, "layouts",
                      [layout(x) for x in labels]) == 0
    assert [f.split(" 0:")[0] for f in seen] == [
        "tp1 pp1 dp2 0/3", "tp1 pp2 dp1 1/3", "tp2 pp1 dp1 2/3"]
    assert seen[0].endswith("eta -:--:--")  # nothing done yet: no pace to go by
    assert console._progress is None  # stopped once the rows are written


def test_the_time_left_is_the_pace_so_far_from_the_first_step():
    eta = Eta()
    assert eta.render(SimpleNamespace(completed=0, total=5, elapsed=3.0)).plain == "eta -:--:--"
    assert eta.render(SimpleNamespace(completed=1, total=5, elapsed=40.0)).plain == "eta 0:02:40"
    assert eta.render(SimpleNamespace(completed=2, total=3, elapsed=7300.0)).plain == \
        "eta 1:00:50"


def test_no_bar_off_a_terminal():
    console = Console(True)
    console.err = RichConsole(file=io.StringIO(), force_terminal=False)
    console.start_progress(5)
    assert console._progress is None

"""What `distbench accept` leaves beside its CSV: accept.json, every verdict for tools (and the
baseline a later run reads), and accept.md, the report a person forwards: what ran, on what,
the verdicts, the nodes named and the topology."""

from __future__ import annotations

import json
import math
import sys
import threading
from pathlib import Path

from distbench.core import noise
from distbench.core.exitcodes import EXIT_BELOW, EXIT_INCONCLUSIVE, EXIT_OK, EXIT_WRONG
from distbench.core.tables import markdown_table
from distbench.kinds.accept.verdicts import Baseline, Judged
from distbench.platform import topo_render
from distbench.results import writer

SCHEMA_VERSION = 1
VERDICT_WORDS = {EXIT_OK: "PASS", EXIT_BELOW: "FAIL", EXIT_WRONG: "FAIL (wrong results)",
                 EXIT_INCONCLUSIVE: "INCONCLUSIVE"}


def read_baseline(run_dir: Path, profile=None) -> Baseline:
    """What a previous run measured (first pass only), of the checks that measure the same
    thing (command, op, dtype, metric) in `profile` (None: every check): per (check, target)
    its figure and, where the file has it, its spread; and the noise that run shows, the median
    spread of its measured targets. Wrong data and failed checks are no figure to expect. An
    accept.json from before spreads were written has none: the tolerance alone holds there.
    Raises ValueError on a file that is no accept.json, or one with a figure no run measures
    (NaN, negative)."""
    path = Path(run_dir) / "accept.json"
    try:
        verdicts = json.loads(path.read_text())["verdicts"]
        _check_figures(path, verdicts)
        same = None if profile is None else {
            c.name: (c.command, c.op, c.dtype, c.metric) for c in profile.checks}
        measured = [v for v in verdicts
                    if v["measured"] is not None and not v["retest"] and not v.get("wrong")]
        usable = [v for v in measured if v.get("verdict") != "FAIL"
                  and (same is None or same.get(v["check"]) == (
                      v.get("command"), v.get("op"), v.get("dtype"), v.get("metric")))]
        return Baseline(
            figures={(v["check"], v["target"]): float(v["measured"]) for v in usable},
            spreads={(v["check"], v["target"]): float(v["spread"]) for v in usable
                     if v.get("spread") is not None},
            typical=noise.typical(float(v["spread"]) for v in measured
                                  if v.get("spread") is not None))
    except BadFigure:
        raise
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path}: not a distbench accept.json ({type(e).__name__}: {e})") \
            from None


class BadFigure(ValueError):
    """A baseline row whose figure no run measures: its message names the file and the key."""


# what a run writes in a row: a figure above 0, and a spread of 0 (repetitions that agree) or
# more; Python's json reads NaN and Infinity, and a NaN baseline passes every comparison
_FIGURES = {"measured": "above 0", "spread": "at least 0"}


def _check_figures(path: Path, verdicts) -> None:
    if not isinstance(verdicts, list):
        raise TypeError(f"'verdicts' is {type(verdicts).__name__}, not a list")
    for i, v in enumerate(verdicts):
        if not isinstance(v, dict):
            raise TypeError(f"verdicts[{i}] is {type(v).__name__}, not an object")
        for key, bound in _FIGURES.items():
            value = v.get(key)
            if value is None or _figure_ok(value, strict=bound == "above 0"):
                continue
            raise BadFigure(f"{path}: verdicts[{i}] (check {v.get('check')!r} on "
                            f"{v.get('target')!r}) key {key!r}: must be a finite number "
                            f"{bound}, got {json.dumps(value)}")


def _figure_ok(value, strict: bool) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return math.isfinite(value) and (value > 0 if strict else value >= 0)


def _fmt(value) -> str:
    if value is None:
        return "-"
    return f"{value:.4g}" if isinstance(value, float) else str(value)


class AcceptFiles:
    """accept.json and accept.md from the first check on, on rank 0: rewritten when a check
    starts and when its rows are judged and written, with a `status` ("running", then how the
    run ended, as run.json says it), the checks done and the one in progress, so a run stopped
    halfway (Ctrl-C, a lost node, a timeout) still says how far it got and what it found."""

    def __init__(self, run_dir: Path | None, record, profile, why: str, names: list[str], rt,
                 strict: bool):
        self.run_dir, self.record, self.profile, self.why = run_dir, record, profile, why
        self.names, self.rt, self.strict = names, rt, strict
        self.done: list[str] = []
        self.current: str | None = None
        self.judged: Judged | None = None
        self.status, self.code, self.error = "running", None, None
        # every check judged: Judged.outcome's (status, exit code, line), said once it is known
        self.outcome: tuple[str, int, str] | None = None
        # the main thread writes as the checks go; the watchdog's may end the run meanwhile
        self._lock = threading.Lock()
        self._write()

    def begin(self, check: str) -> None:
        self.current = check
        self._write()

    def finished(self, check: str, judged: Judged) -> None:
        """The check's rows are judged (retests included) and in accept.csv."""
        self.done.append(check)
        self.current, self.judged = None, judged
        self._write()

    def conclude(self, judged: Judged) -> None:
        """Every check judged: the verdict, and run.json's `accept`."""
        self.judged, self.outcome = judged, judged.outcome(self.strict)
        self.status, self.code, _ = self.outcome
        summary = self._write()
        if self.record is not None and summary is not None:
            self.record.update(accept={k: summary[k] for k in ("verdict", "summary", "profile",
                                                               "culprits", "notes")})

    def ended(self, status: str, code: int, error: str | None) -> None:
        """How the run ended, as run.json says it (Session.on_end, from whichever thread ends
        the run: the main one, or the watchdog's on a timeout or a vanished launcher)."""
        self.status, self.code, self.error = status, code, error
        # run.json is finished by now; whatever fails here must not keep the run from ending
        # with its own code (the session's ending calls this)
        try:
            self._write()
        except Exception as e:
            why = e.strerror if isinstance(e, OSError) else f"{type(e).__name__}: {e}"
            print(f"distbench: rank 0: error: cannot finish {self.run_dir}/accept.json: {why}; "
                  "it may still say \"running\"", file=sys.stderr, flush=True)

    def _write(self) -> dict | None:
        if self.run_dir is None:
            return None
        judged = self.judged
        with self._lock:
            summary = {"schema_version": SCHEMA_VERSION, "status": self.status,
                       "verdict": None, "exit_code": self.code, "summary": self._line(),
                       "checks_total": len(self.profile.checks), "checks_done": list(self.done),
                       "check_in_progress": self.current,
                       "profile": {"name": self.profile.name, "path": str(self.profile.path),
                                   "why": self.why},
                       "nodes": self.names, "world_size": self.rt.world,
                       "backend": self.rt.backend,
                       "culprits": judged.culprits if judged else [],
                       "notes": judged.notes if judged else [],
                       "verdicts": judged.rows() if judged else []}
            if self.outcome is not None:
                summary["verdict"] = VERDICT_WORDS[self.outcome[1]]
            writer.write_json(self.run_dir / "accept.json", summary)
            (self.run_dir / "accept.md").write_text(render_md(summary, self.record, self.rt))
        return summary

    def _line(self) -> str:
        """The verdict's line once every check is judged; before, how far the run got."""
        if self.outcome is not None:
            return self.outcome[2]
        far = f"{len(self.done)} of {len(self.profile.checks)} checks done" + (
            f", {self.current} in progress" if self.current else "")
        if self.status == "running":
            return f"running: {far}"
        return f"{self.status}: {far}" + (f" ({self.error})" if self.error else "")


def _verdict_cells(v: dict) -> list[str]:
    retest = " (retest)" if v["retest"] else ""
    unit = f" {v['metric']}" if v["measured"] is not None else ""
    return [f"{v['check']}{retest}", v["scope"], v["target"], f"{_fmt(v['measured'])}{unit}",
            _fmt(v["expected"]), _fmt(v["ratio"]), f"**{v['verdict']}**", v["note"]]


def render_md(summary: dict, record, rt) -> str:
    """The report: a person reads it without distbench at hand."""
    meta = record.data if record is not None else {}
    versions = meta.get("versions") or {}
    lines = [
        f"# Acceptance: {summary['verdict'] or summary['status'] + ', unfinished'}",
        "",
        f"{summary['summary']}.",
        "",
        "## What ran",
        "",
        f"- command: `distbench {' '.join(meta.get('argv', []))}`",
        f"- started: {meta.get('start_utc', '?')} (UTC)",
        f"- profile: **{summary['profile']['name']}**, {summary['profile']['why']}",
        f"- nodes: {len(summary['nodes'])} ({', '.join(summary['nodes'])}), "
        f"{summary['world_size']} ranks, backend {summary['backend']}",
        f"- distbench {meta.get('distbench_version', '?')}, torch {versions.get('torch', '?')}, "
        f"NCCL {versions.get('nccl') or '-'}, CUDA {versions.get('cuda') or '-'}, "
        f"driver {versions.get('driver') or '-'}",
        "",
        "## Verdicts",
        "",
    ]
    lines += markdown_table(["check", "scope", "target", "measured", "expected", "ratio",
                             "verdict", "why"], map(_verdict_cells, summary["verdicts"]))
    lines += ["", "## Named", ""]
    lines += [f"- {c}" for c in summary["culprits"]] or ["- nothing: no check points at a "
                                                         "node"]
    if summary["notes"]:
        lines += ["", "## Notes", "", *[f"- {n}" for n in summary["notes"]]]
    lines += ["", "## Topology", "", "```", *topo_render.summary_lines(rt.snapshots), "```", ""]
    return "\n".join(lines)

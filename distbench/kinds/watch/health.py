"""A watch verdict in the forms node health checkers take. Torch-free, and no process started
here: the command decides whether to run what drain_command gives.

- Kubernetes node-problem-detector custom plugins (npd_result): exit 0 OK, 1 a problem, 2
  unknown, and a message of at most 80 characters (NPD's limit).
- Slurm's HealthCheckProgram (drain_command, drain_reason): Slurm ignores the program's exit
  code, the program drains the node itself with `scontrol update ... State=drain Reason=...`.
- The exit code (exit_code) is distbench's own (core/exitcodes.py), whatever the verdict came
  from (--once, --count, --duration):
    ok      -> 0 EXIT_OK
    warn    -> 4 EXIT_BELOW (a probe worse than its baseline, or a straggler named)
    fail    -> 4 EXIT_BELOW
    unknown -> 5 EXIT_INCONCLUSIVE (nothing judged: never a pass)
  A watch that could not run at all exits as any command does (2 bad input, 3 a failed rank),
  before there is a verdict to map.
"""

from __future__ import annotations

import re
import shlex
import signal
from dataclasses import dataclass

from distbench.core.exitcodes import EXIT_BELOW, EXIT_INCONCLUSIVE, EXIT_OK
from distbench.core.sizes import format_size
from distbench.kinds.watch.records import STATES, Judgement

NPD_OK, NPD_PROBLEM, NPD_UNKNOWN = 0, 1, 2
NPD_CHARS = 80
REASON_CHARS = 120  # a drain reason that fits `sinfo -R` and a terminal line
_NODE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")  # a Slurm node name (a hostname)
# not needed by scontrol (no shell runs the argv), but a reason with them reads badly in
# `sinfo -R` and in the printed line
_UNSAFE = re.compile(r"[\"'`$\\]")


def _short(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3].rstrip() + "..."


def _probe(key: str) -> str:
    """A Probe.key ("all_reduce/1048576/cluster") as a person reads it: "all_reduce 1 MiB"."""
    op, size, scope = key.split("/")
    return f"{op} {format_size(int(size))}" + ("" if scope == "cluster" else f" {scope}")


def npd_result(judgement: Judgement | None, stragglers_named: list[str]) -> tuple[int, str]:
    """(exit code, message) for a node-problem-detector custom plugin. `stragglers_named`: the
    stragglers as the caller names them ("rank 1 gpu7"). A named straggler is a problem even
    while every probe reads ok."""
    if judgement is None:
        return NPD_UNKNOWN, "distbench: the watch could not run"
    if judgement.verdict == "unknown" and not stragglers_named:
        return NPD_UNKNOWN, "distbench: nothing judged yet (no baseline)"
    worst = [key for key, s in judgement.probes.items() if s.state == judgement.verdict]
    parts = []
    if worst and judgement.verdict in ("warn", "fail"):  # none: a straggler's warn alone
        more = f" +{len(worst) - 1}" if len(worst) > 1 else ""
        parts.append(f"{judgement.verdict} {_probe(worst[0])}{more}")
    if stragglers_named:
        parts.append("straggler " + ", ".join(stragglers_named))
    if not parts:
        return NPD_OK, _short(f"distbench: ok ({len(worst)} probes)", NPD_CHARS)
    return NPD_PROBLEM, _short("distbench: " + "; ".join(parts), NPD_CHARS)


@dataclass(frozen=True)
class Drain:
    """What drains a node: the argv that runs (no shell) and the same as a line a person can
    paste into a shell."""

    argv: list[str]
    line: str


def npd_refusal(message: str) -> str:
    """A refusal as node-problem-detector shows it: one line of at most NPD_CHARS, without the
    example (stderr has the whole line)."""
    return _short("distbench: bad input: " + message.rsplit(" (example:", 1)[0], NPD_CHARS)


def npd_stopped(signum: int) -> str:
    """node-problem-detector's line for a watch stopped by a signal (its code: unknown)."""
    return f"distbench: stopped by {signal.Signals(signum).name} before a verdict"


def drain_command(node: str, reason: str) -> Drain:
    """What drains `node` with "distbench: <reason>" (one line, bounded). A node name that is
    not a Slurm node name is refused (ValueError): it would update another field."""
    if not _NODE.fullmatch(node):
        raise ValueError(f"not a Slurm node name: {node!r}")
    text = _short(_UNSAFE.sub("", reason), REASON_CHARS - len("distbench: "))
    argv = ["scontrol", "update", f"NodeName={node}", "State=drain",
            f"Reason=distbench: {text}"]
    return Drain(argv, shlex.join(argv))


def should_drain(judgement: Judgement) -> bool:
    """A fail verdict, or a straggler named: a node the others wait for, cycle after cycle (or
    in the one cycle of --once), is unfit for a job however its probes read."""
    return judgement.verdict == "fail" or bool(judgement.stragglers)


def drain_reason(judgement: Judgement, names: dict[int, str]) -> str:
    """What failed, as `sinfo -R` shows it: each probe at the verdict's state with its time
    against the baseline, then each straggler (`names`: rank -> "rank 1 (gpu7)") with where it
    was late and by how much."""
    parts = []
    for key, s in judgement.probes.items():
        if s.state != judgement.verdict or s.state not in ("warn", "fail"):
            continue
        against = (f" {s.median_us / s.baseline_us:.2f}x baseline"
                   if s.median_us and s.baseline_us else "")
        parts.append(f"{_probe(key)} {s.state}{against}")
    for rank in judgement.stragglers:
        late = judgement.late_why.get(rank)
        parts.append(f"straggler {names.get(rank, f'rank {rank}')}"
                     + (f": {late[1]:.4g} us late in {_probe(late[0])}" if late else ""))
    return "; ".join(parts) or f"verdict {judgement.verdict}"


def exit_code(verdict: str) -> int:
    """distbench's exit code for a watch's verdict (the module docstring's table)."""
    if verdict not in STATES:
        raise ValueError(f"verdict {verdict!r} is not one of {STATES}")
    return {"ok": EXIT_OK, "unknown": EXIT_INCONCLUSIVE}.get(verdict, EXIT_BELOW)

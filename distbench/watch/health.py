"""A watch verdict in the forms node health checkers take. Torch-free, and no process started
here: the command decides whether to run what drain_command gives.

- Kubernetes node-problem-detector custom plugins (npd_result): exit 0 OK, 1 a problem, 2
  unknown, and a message of at most 80 characters (NPD's limit).
- Slurm's HealthCheckProgram (slurm_exit_code, drain_command): Slurm ignores the program's exit
  code, the program drains the node itself with `scontrol update ... State=drain Reason=...`.
  The exit code is distbench's own (core/exitcodes.py), with accept's meanings, so a script
  reads watch --once as it reads accept:
    ok      -> 0 EXIT_OK
    warn    -> 0 EXIT_OK (a warning is allowed, as in accept), or 4 EXIT_BELOW with strict
    fail    -> 4 EXIT_BELOW (measured fine but below expectation)
    unknown -> 5 EXIT_INCONCLUSIVE (nothing judged: never a pass)
  A watch that could not run at all exits as any command does (2 bad input, 3 a failed rank),
  before there is a verdict to map.
"""

from __future__ import annotations

import re
import shlex

from distbench.core.exitcodes import EXIT_BELOW, EXIT_INCONCLUSIVE, EXIT_OK
from distbench.core.sizes import format_size
from distbench.watch.records import STATES, Judgement

NPD_OK, NPD_PROBLEM, NPD_UNKNOWN = 0, 1, 2
NPD_CHARS = 80
REASON_CHARS = 120  # a drain reason that fits `sinfo -R` and a terminal line
_NODE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")  # a Slurm node name (a hostname)
_UNSAFE = re.compile(r"[\"'`$\\]")  # what a shell would read inside the line's double quotes


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


def drain_command(node: str, reason: str) -> list[str]:
    """The argv that drains `node` with "distbench: <reason>" (one line, no quotes, bounded).
    No shell runs it, so the reason needs no quotes of its own; drain_line shows it as a shell
    line. A node name that is not a hostname is refused (ValueError): it would update another
    field."""
    if not _NODE.fullmatch(node):
        raise ValueError(f"not a Slurm node name: {node!r}")
    text = _short(_UNSAFE.sub("", reason), REASON_CHARS - len("distbench: "))
    return ["scontrol", "update", f"NodeName={node}", "State=drain",
            f"Reason=distbench: {text}"]


def drain_line(node: str, reason: str) -> str:
    """drain_command as a person types it: `... Reason="distbench: <reason>"`."""
    *head, last = drain_command(node, reason)
    key, _, value = last.partition("=")
    return shlex.join(head) + f' {key}="{value}"'


def slurm_exit_code(verdict: str, *, strict: bool = False) -> int:
    """distbench's exit code for a verdict (the module docstring's table)."""
    if verdict not in STATES:
        raise ValueError(f"verdict {verdict!r} is not one of {STATES}")
    if verdict == "unknown":
        return EXIT_INCONCLUSIVE
    if verdict == "fail" or (verdict == "warn" and strict):
        return EXIT_BELOW
    return EXIT_OK

"""What `distbench accept` leaves beside its CSV: accept.json, every verdict for tools (and the
baseline a later run reads), and accept.md, the report a person forwards: what ran, on what,
the verdicts, the nodes named and the topology."""

from __future__ import annotations

import json
from pathlib import Path

from distbench import results, topo
from distbench.exitcodes import EXIT_BELOW, EXIT_OK, EXIT_WRONG
from distbench.verdicts import Judged

SCHEMA_VERSION = 1
VERDICT_WORDS = {EXIT_OK: "PASS", EXIT_BELOW: "FAIL", EXIT_WRONG: "FAIL (wrong results)"}


def read_baseline(run_dir: Path, profile=None) -> dict[tuple[str, str], float]:
    """(check, target) -> what a previous run measured (first pass only), of the checks that
    measure the same thing (command, op, dtype, metric) in `profile` (None: every check).
    Wrong data and failed checks are no figure to expect. Raises ValueError on a file that is
    no accept.json."""
    path = Path(run_dir) / "accept.json"
    try:
        verdicts = json.loads(path.read_text())["verdicts"]
        same = None if profile is None else {
            c.name: (c.command, c.op, c.dtype, c.metric) for c in profile.checks}
        return {(v["check"], v["target"]): float(v["measured"]) for v in verdicts
                if v["measured"] is not None and not v["retest"] and not v.get("wrong")
                and v.get("verdict") != "FAIL"
                and (same is None or same.get(v["check"]) == (
                    v.get("command"), v.get("op"), v.get("dtype"), v.get("metric")))}
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path}: not a distbench accept.json ({type(e).__name__}: {e})") \
            from None


def _fmt(value) -> str:
    if value is None:
        return "-"
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def write(run_dir: Path | None, record, profile, why: str, judged: Judged, names: list[str],
          rt, strict: bool) -> None:
    if run_dir is None:
        return
    status, code, line = judged.outcome(strict)
    summary = {"schema_version": SCHEMA_VERSION, "verdict": VERDICT_WORDS[code],
               "exit_code": code, "summary": line,
               "profile": {"name": profile.name, "path": str(profile.path), "why": why},
               "nodes": names, "world_size": rt.world, "backend": rt.backend,
               "culprits": judged.culprits, "notes": judged.notes,
               "verdicts": judged.rows()}
    results.write_json(run_dir / "accept.json", summary)
    (run_dir / "accept.md").write_text(render_md(summary, record, rt))
    if record is not None:
        record.update(accept={k: summary[k] for k in ("verdict", "summary", "profile",
                                                      "culprits", "notes")})


def render_md(summary: dict, record, rt) -> str:
    """The report: a person reads it without distbench at hand."""
    meta = record.data if record is not None else {}
    versions = meta.get("versions") or {}
    lines = [
        f"# Acceptance: {summary['verdict']}",
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
        "| check | scope | target | measured | expected | ratio | verdict | why |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for v in summary["verdicts"]:
        retest = " (retest)" if v["retest"] else ""
        unit = f" {v['metric']}" if v["measured"] is not None else ""
        lines.append(f"| {v['check']}{retest} | {v['scope']} | {v['target']} | "
                     f"{_fmt(v['measured'])}{unit} | {_fmt(v['expected'])} | "
                     f"{_fmt(v['ratio'])} | **{v['verdict']}** | {v['note']} |")
    lines += ["", "## Named", ""]
    lines += [f"- {c}" for c in summary["culprits"]] or ["- nothing: no check points at a "
                                                         "node"]
    if summary["notes"]:
        lines += ["", "## Notes", "", *[f"- {n}" for n in summary["notes"]]]
    lines += ["", "## Topology", "", "```", *topo.summary_lines(rt.snapshots), "```", ""]
    return "\n".join(lines)

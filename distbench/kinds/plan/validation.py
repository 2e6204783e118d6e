"""`plan --validate K`: the chosen layouts stepped for real by the step command's measurement
(step.csv), each against its prediction (validation.csv), and the errors over them."""

from __future__ import annotations

import math
from collections.abc import Callable

from distbench.bench.measure import fail_if_wrong
from distbench.core.exitcodes import EXIT_OK
from distbench.core.tables import plural
from distbench.kinds.plan.output import VALIDATION
from distbench.kinds.step.output import OUTPUT as STEP
from distbench.planner import assemble
from distbench.planner import ranking as planning
from distbench.planner.inputs import Inputs
from distbench.planner.models import ModelSpec
from distbench.run.session import Session
from distbench.steps import step3d


def validate(s: Session, model: ModelSpec, dtype, rows: list[dict], details: dict,
             inputs: Inputs, speed_drift: Callable[[], tuple[float | None, str | None]]
             ) -> int:
    """The chosen layouts stepped for real (step.csv), each against its prediction
    (validation.csv), written as measured; then the mean absolute percentage error and the
    Spearman rank correlation over those that ran, and the error over those out of sample (no
    input was measured on them: the data-parallel and pipeline figures come from pure layouts)."""
    opts = s.opts
    calibrated = {label: kind for kind, label in inputs.overlap_layouts.items()}
    chosen = planning.pick_validation(rows, opts.validations, s.rt.world, calibrated)
    capped = planning.validation_notes(
        opts.validations, chosen, calibrated, world=s.rt.world,
        fitting=sum(1 for r in rows if r["fits"] and r["world_size"] == s.rt.world))
    for note in capped:
        s.console.log(note)
    s.console.log(f"validating {plural(len(chosen), 'layout')} for real: "
                  + ", ".join(planning.label(r) for r in chosen))
    step_sink, val_sink = s.sink(STEP), s.sink(VALIDATION)
    pairs: list[tuple[float, float]] = []
    unseen: list[tuple[float, float]] = []
    bad: list[str] = []
    found: dict = {"layouts": []}
    details["validation"] = found
    for r in chosen:
        layout = planning.layout_of(r)
        s.console.working_on(f"validating {layout.label()}")
        row, _ = step3d.measure_layout(s, model, layout, dtype, bad, check=False)
        step_sink.append(row)
        predicted = r["predicted_step_ms"]
        ok = row.get("status") == "ok" and row.get("step_us")
        measured = row["step_us"] / 1e3 if ok else None
        err = (predicted / measured - 1) * 100 if ok else None
        kind = calibrated.get(layout.label())
        notes = [f"in-sample: the {kind} figure was measured on this layout"] if kind else []
        val = {"model": model.name, **layout.to_json(), "predicted_step_ms": predicted,
               "measured_step_ms": measured, "error_pct": err, "in_sample": int(bool(kind)),
               "status": row.get("status"),
               "note": "; ".join(notes + ([row["note"]] if row.get("note") else []))}
        val_sink.append(val)
        found["layouts"].append(val)
        if ok:
            pairs.append((predicted, measured))
            if not kind:
                unseen.append((predicted, measured))
        if s.record is not None:
            s.record.update(plan=details)
        s.console.log(f"  {layout.label()}: predicted {predicted:.2f} ms, measured "
                      + (f"{measured:.2f} ms ({err:+.1f}%)" if ok else str(row.get("status"))))
        s.console.advance()
    drift, drift_line = speed_drift()
    s.console.stop_progress()
    mape, rho = planning.validation_summary(pairs) if pairs else (None, None)
    unseen_mape = planning.validation_summary(unseen)[0] if unseen else None
    if len(pairs) < planning.MIN_RANKED or (rho is not None and math.isnan(rho)):
        rho = None  # said why in the lines below
    lines = planning.validation_lines(pairs, unseen) + ([drift_line] if drift_line else [])
    found.update(mape_pct=mape, spearman=rho, layouts_measured=len(pairs),
                 out_of_sample_mape_pct=unseen_mape, out_of_sample_layouts=len(unseen),
                 speed_drift_pct=drift, notes=[*capped, *lines])
    if s.record is not None:
        s.record.update(plan=details)
    for line in lines:
        s.console.log(line)
    if s.run_dir is not None:
        with open(s.run_dir / planning.PLAN_MD, "a") as fh:
            fh.write(planning.validation_md(found, capped, lines))
        if opts.plot:
            assemble.write_validation(s.run_dir, found["layouts"], model, s.rt.world,
                                      s.rt.world // max(1, s.rt.nnodes), opts.dtype,
                                      inputs.device)
    fail_if_wrong(bad)
    return EXIT_OK

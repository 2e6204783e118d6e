"""How far are `distbench plan`'s predictions from the steps it predicts? The issue-22 check,
rerunnable: `plan --workers W --validate K` run again and again on this machine, each run's
validation.csv and run.json read back.

    python benchmarks/plan_accuracy.py [--runs 3] [--workers 4] [--validate 6] [--keep DIR]
                                       [--args "--model toy --min-time 3"]

Prints, per run, each validated layout (predicted, measured, error, in-sample or not), then the
run's MAPE, Spearman and the MAPE over the layouts out of sample; at the end the same over all
runs' layouts together, and the mean absolute error per layout kind (pure DP, pure PP, pure TP,
mixed). Runs go to a temporary directory, removed at the end unless --keep names one (a later
`plan --from` can read those). On the 2-core VM with 4 workers one run takes about 4 minutes.
"""

from __future__ import annotations

import argparse
import csv
import json
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from distbench.planner.ranking import validation_summary  # noqa: E402


def kind(row: dict) -> str:
    spread = [d for d in ("tp", "pp", "dp") if int(row[d]) > 1]
    return f"pure {spread[0].upper()}" if len(spread) == 1 else "mixed"


def one_run(out: Path, workers: int, validate: int, extra: list[str]) -> tuple[list[dict], dict]:
    out.mkdir(parents=True)
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "distbench", "plan", "--workers", str(workers),
                           "--validate", str(validate), "--out", str(out), *extra],
                          capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        sys.exit(f"plan_accuracy: a run failed (exit {done.returncode}): "
                 f"{done.stderr.strip()[-2000:]}")
    (run_dir,) = [p for p in out.iterdir() if p.is_dir()]
    with open(run_dir / "validation.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    found = json.loads((run_dir / "run.json").read_text())["plan"]["validation"]
    found["seconds"] = time.monotonic() - start
    found["run_dir"] = str(run_dir)
    return rows, found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--validate", type=int, default=6)
    ap.add_argument("--args", default="", help="more plan options, as one string")
    ap.add_argument("--keep", type=Path, help="keep the runs under this directory")
    a = ap.parse_args()
    root = a.keep or Path(tempfile.mkdtemp(prefix="plan-accuracy-"))
    every: list[dict] = []
    for i in range(a.runs):
        rows, found = one_run(root / f"run{i + 1}", a.workers, a.validate, shlex.split(a.args))
        print(f"run {i + 1} ({found['seconds']:.0f} s, {found['run_dir']}):")
        for r in rows:
            mark = " in-sample" if r["in_sample"] == "1" else ""
            print(f"  tp{r['tp']} pp{r['pp']} dp{r['dp']} zero{r['zero']} m{r['micro_batches']}:"
                  f" predicted {float(r['predicted_step_ms']):8.2f} ms, measured "
                  f"{float(r['measured_step_ms']):8.2f} ms, {float(r['error_pct']):+6.1f}%{mark}")
        oos = found.get("out_of_sample_mape_pct")
        rho = found["spearman"]  # None over too few layouts (plan.MIN_RANKED)
        drift = found.get("speed_drift_pct")  # the machine's own speed, inputs to the end
        print(f"  MAPE {found['mape_pct']:.1f}%, Spearman "
              + ("none (too few layouts)" if rho is None else f"{rho:.2f}")
              + (f", MAPE {oos:.1f}% over the {found['out_of_sample_layouts']} out of sample"
                 if oos is not None else "")
              + (f"; the machine's speed drifted {drift:+.1f}% (a layer's time, inputs to "
                 "validations)" if drift is not None else ""))
        every += [r for r in rows if r["status"] == "ok"]
    pairs = [(float(r["predicted_step_ms"]), float(r["measured_step_ms"])) for r in every]
    mape, _ = validation_summary(pairs)
    unseen = [p for p, r in zip(pairs, every, strict=True) if r["in_sample"] != "1"]
    print(f"all {len(pairs)} layouts: MAPE {mape:.1f}%"
          + (f"; {len(unseen)} out of sample: MAPE {validation_summary(unseen)[0]:.1f}%"
             if unseen else ""))
    kinds: dict[str, list[float]] = {}
    for r in every:
        kinds.setdefault(kind(r), []).append(abs(float(r["error_pct"])))
    for k, errs in sorted(kinds.items()):
        print(f"  {k}: mean |error| {sum(errs) / len(errs):.1f}% over {len(errs)}")
    if a.keep is None:
        import shutil

        shutil.rmtree(root)


if __name__ == "__main__":
    main()

"""The table benchmarks/gpu_first_contact.sh ends with: one row per item, its figure, what
docs/gpu-checklist.md expects of it and pass or fail, read from the run directories, test reports
and log the script left in its work folder.

    python benchmarks/gpu_first_contact_table.py WORK_DIR > table.md

A row whose inputs are missing (the item was not run, or ran out of its time) says so and fails:
nothing measured is never a pass."""

from __future__ import annotations

import csv
import json
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

W = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(".")
LOG = Path(sys.argv[2]) if len(sys.argv) > 2 else None
rows: list[tuple[str, str, str, str]] = []


def add(item: str, figure: str, expected: str, ok: bool | None) -> None:
    verdict = "n/a" if ok is None else ("pass" if ok else "FAIL")
    rows.append((item, figure, expected, verdict))


def exits() -> dict[str, tuple[int | str, int]]:
    out = {}
    path = W / "items.tsv"
    for line in path.read_text().splitlines() if path.exists() else []:
        _, name, rc, secs = line.split("\t")
        out[name] = (int(rc) if rc.lstrip("-").isdigit() else rc, int(secs))
    return out


RC = exits()


def ran(name: str) -> str:
    rc, secs = RC.get(name, ("not run", 0))
    return f"exit {rc}, {secs}s" if isinstance(rc, int) else str(rc)


def run_dir(name: str) -> Path | None:
    found = sorted((W / "runs" / name).glob("*/run.json"))
    return found[-1].parent if found else None


def csv_rows(name: str, file: str) -> list[dict]:
    d = run_dir(name)
    if d is None or not (d / file).exists():
        return []
    with open(d / file, newline="") as f:
        return list(csv.DictReader(f))


def num(value, default=float("nan")) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return default


def junit(path: Path) -> tuple[int, int, int, int] | None:
    if not path.exists():
        return None
    root = ET.parse(path).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    get = lambda k: int(suite.get(k, 0))  # noqa: E731
    return get("tests"), get("failures"), get("errors"), get("skipped")


def log_section(name: str) -> str:
    if LOG is None or not LOG.exists():
        return ""
    text = LOG.read_text(errors="replace")
    m = re.search(rf"^=== {re.escape(name)} \(item.*?^=== {re.escape(name)}: exit", text,
                  re.S | re.M)
    return m.group(0) if m else ""


def gib(b: float) -> str:
    return f"{b / 2**30:.2f} GiB"


# 1: versions and topo
versions = re.search(r"^torch .*$", log_section("versions"), re.M)
add("1 versions", versions.group(0) if versions else ran("versions"), "torch, CUDA, NCCL, GPU",
    bool(versions))
topo = run_dir("topo")
snap = json.loads((topo / "topo.json").read_text()) if topo and (topo / "topo.json").exists() \
    else None
if snap:
    node = snap[0] if isinstance(snap, list) else snap
    node = node.get("nodes", [node])[0] if isinstance(node, dict) and "nodes" in node else node
    gpus = node.get("gpus", [])
    g = gpus[0] if gpus else {}
    errors = {k: v for k, v in (g.get("errors") or {}).items()}
    fig = (f"{g.get('name')} {g.get('uuid')} PCIe max Gen{g.get('pcie_gen_max')} "
           f"x{g.get('pcie_width_max')}, NVLink {g.get('nvlink_version', '-')} "
           f"links up {g.get('nvlinks_up', '-')}"
           f"; errors: {errors or 'none'}")
    add("1 topo (NVML)", fig, "UUID, PCIe max Gen5 x16 (H100 SXM); no field unread but NVLink "
        "on a lone card", bool(str(g.get("uuid", "")).startswith("GPU-"))
        and not {k for k in errors if not k.startswith("nvlink")})
else:
    add("1 topo (NVML)", ran("topo"), "topo.json with the GPU", False)

# 2: the GPU-only tests
for name, label, file in (("gpu-tests", "2 GPU-only tests", "gpu-tests.xml"),
                          ("cpu-suite", "9 the one-process tests on the GPU machine",
                           "cpu-suite.xml"),
                          ("multiproc-suite", "9 the multi-process tests on the GPU machine",
                           "multiproc-suite.xml")):
    counts = junit(W / file)
    if counts:
        t, f, e, s = counts
        add(label, f"{t} tests: {t - f - e - s} passed, {f} failed, {e} errors, {s} skipped "
            f"({ran(name)})", "all pass, none skipped" if name == "gpu-tests" else "all pass",
            f == e == 0 and (s == 0 or name != "gpu-tests") and t > 0)
    else:
        add(label, ran(name), "all pass", False)

# 3: the sweep, without and with the graph
plain, graph = csv_rows("collective", "collective.csv"), csv_rows("collective-graph",
                                                                  "collective.csv")
if plain and graph:
    by = lambda rs: {int(r["size_bytes"]): r for r in rs}  # noqa: E731
    p, g = by(plain), by(graph)
    small = [s for s in sorted(p) if s <= 4096]
    bound = [s for s in small if p[s].get("launch_bound") == "1"]
    faster = [s for s in small if s in g and num(g[s]["time_us"]) < num(p[s]["time_us"])]
    big = max(p)
    skipped = [s for s, r in g.items() if r["status"] != "ok"]
    fig = (f"8 B: {num(p[8]['time_us']):.1f} us plain, {num(g.get(8, {}).get('time_us')):.3g} "
           f"us graph; launch_bound on {len(bound)}/{len(small)} sizes <= 4 KiB; graph faster on "
           f"{len(faster)}/{len(small)}; {big >> 20} MiB: {num(p[big]['time_us']):.0f} us, "
           f"algbw {num(p[big]['algbw_gbps']):.0f} GB/s; graph rows not ok: {len(skipped)}")
    add("3 collective 8 B-1 GiB, --cuda-graph", fig,
        "launch_bound = 1 on small sizes without the graph; with it no skipped row and smaller "
        "times", bool(bound) and len(faster) >= len(small) // 2 and not skipped)
else:
    add("3 collective 8 B-1 GiB, --cuda-graph", f"{ran('collective')}; graph "
        f"{ran('collective-graph')}", "both sweeps measured", False)

# 4: sizes beyond the device
large = csv_rows("collective-large", "collective.csv")
oom = re.search(r"out of memory|CUDA error|ncclSystemError|ncclInternalError",
                log_section("collective-large"), re.I)
if large:
    def sizes(rs):
        return ", ".join(f"{r['op']} {gib(int(r['size_bytes']))}" for r in rs) or "none"
    measured = [r for r in large if r["status"] == "ok"]
    skipped = [r for r in large if r["status"] != "ok"]
    # a skip below a measured size of the same op: a fit check that cascades
    cascade = any(int(s["size_bytes"]) < int(m["size_bytes"]) and s["op"] == m["op"]
                  for s in skipped for m in measured)
    why = f" ({skipped[0]['note'][:90]})" if skipped else ""
    fig = f"measured {sizes(measured)}; skipped {sizes(skipped)}{why}; OOM in log: {bool(oom)}"
    add("4 collective 1-128 GiB", fig, "the largest sizes skipped as not fitting, every "
        "smaller measured, no out-of-memory inside NCCL",
        bool(measured and skipped) and not cascade and not oom)
else:
    add("4 collective 1-128 GiB", ran("collective-large"), "rows written", False)

# 5: tp, pp, dp, step at one rank
for name, file in (("tp", "tp.csv"), ("dp", "dp.csv"), ("step", "step.csv"),
                   ("step-1b", "step.csv")):
    rs = csv_rows(name, file)
    if not rs:
        add(f"5 {name}", ran(name), "finishes, checked", False)
        continue
    ok = [r for r in rs if r["status"] == "ok"]
    errs = [num(r.get("max_abs_err")) for r in ok]
    worst = max(errs, default=float("nan"))
    fig = f"{ran(name)}; {len(ok)}/{len(rs)} rows ok; max_abs_err {worst:.3g}"
    if "tflops_per_rank" in rs[0]:
        fig += f"; {max(num(r['tflops_per_rank']) for r in ok) if ok else float('nan'):.0f} TFLOP/s"
    expected = "finishes and passes its check"
    if name.startswith("step") and ok:
        try:
            from distbench.planner.layouts import Layout
            from distbench.planner.memory import held_by_step
            from distbench.planner.models import ModelSpec
            parts = []
            for r in ok:
                model = ModelSpec(name=r["model"], layers=int(r["layers"]),
                                  hidden_size=int(r["hidden_size"]),
                                  ffn_size=int(r["ffn_size"]), heads=int(r["heads"]),
                                  seq_len=int(r["seq_len"]), batch=int(r["batch"]))
                lay = Layout(tp=int(r["tp"]), pp=int(r["pp"]), dp=int(r["dp"]),
                             zero=int(r["zero"]), micro_batches=int(r["micro_batches"]))
                held = held_by_step(model, lay, 2)
                peak = num(r.get("peak_mem_bytes"))
                parts.append(f"{lay.label()}: peak {gib(peak)} vs model {gib(held)} "
                             f"({peak / held:.2f}x)")
            fig += "; " + "; ".join(parts)
            expected += "; measured peak at or under the planner's figure"
        except Exception as e:  # the figure is a report; a failure to compute it is said
            fig += f"; planner figure not computed: {type(e).__name__}: {e}"
    over = "(" in fig and any(float(x) > 1.0 for x in re.findall(r"\(([\d.]+)x\)", fig))
    add(f"5 {name}", fig, expected,
        RC.get(name, (None,))[0] == 0 and len(ok) == len(rs) and not over)
pp_log = log_section("pp")
add("5 pp", f"{ran('pp')}: {(re.search(r'error: .*', pp_log) or [''])[0][:100]}",
    "refused at one rank, exit 2, one line (NCCL has no two ranks on one GPU)",
    RC.get("pp", (None,))[0] == 2 and "needs at least 2" in pp_log)

# 6: plan on the GPU
plan = run_dir("plan")
inputs_path = plan / "inputs.json" if plan else None
inputs = json.loads(inputs_path.read_text()) if inputs_path and inputs_path.exists() else None
if inputs:
    points = inputs.get("compute", [])
    try:
        from distbench.planner.gpus import by_device_name, peak_tflops
        node = (snap[0] if isinstance(snap, list) else snap) if snap else {}
        name = (node.get("gpus") or [{}])[0].get("name", "")
        gpu = by_device_name(name)
        peak = peak_tflops(gpu, "bfloat16") if gpu else None
    except Exception:
        peak = None
    tf = [p["flops"] / p["layer_us"] / 1e6 for p in points if p.get("layer_us")]
    opt = inputs.get("optimizer_us_per_param")
    val = csv_rows("plan", "validation.csv")
    errs = [r.get("error_pct") or r.get("err_pct") for r in val]
    share = f" ({min(tf) / peak:.0%}-{max(tf) / peak:.0%} of {peak:.0f} peak)" \
        if tf and peak else ""
    shown = ("predicted_step_ms", "measured_step_ms", "error_pct")
    checked = "; ".join(f"{k}={r[k]}" for r in val for k in shown if k in r) or "none"
    device = inputs.get("device", "")
    fig = (f"{ran('plan')}; device {device!r}; {len(points)} layer points, "
           f"{min(tf, default=0):.0f}-"
           f"{max(tf, default=0):.0f} TFLOP/s{share}"
           f"; optimizer {opt * 1e6 if opt else float('nan'):.2f} ps/param; validation {checked}")
    add("6 plan 1b --validate 1", fig, "H100 layer times; AdamW a few ps per parameter "
        "(16 B of HBM at ~3 TB/s is ~5 ps); validation ok",
        RC.get("plan", (None,))[0] == 0 and bool(tf) and bool(opt) and opt < 2e-5 and bool(val)
        and device != "cuda")  # the GPU by name, so plan --from knows what it was measured on
else:
    add("6 plan 1b --validate 1", ran("plan"), "inputs.json with H100 layer times", False)

# 7: overhead
over = re.findall(r"^\s*([\d.]+ [KMG]i?B)\s+\d+\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s.*?"
                  r"(noise|outside A/A)", log_section("overhead"), re.M)
if over:
    fig = "; ".join(f"{s}: {a} vs {b} us, ratio {r} ({v})" for s, a, b, r, v in over)
    big = [float(r) for s, _, _, r, _ in over if not s.endswith("KiB")]
    add("7 overhead.py", fig, "ratio within +-3% at 1 MiB and up",
        bool(big) and all(abs(r - 1) <= 0.03 for r in big))
else:
    add("7 overhead.py", ran("overhead"), "one line per size", False)

# 8: accept
acc = run_dir("accept")
aj = json.loads((acc / "accept.json").read_text()) if acc and (acc / "accept.json").exists() \
    else None
picked = re.search(r"profile .*", log_section("accept"))
if aj:
    verdict = aj.get("verdict")
    code = RC.get("accept", (None,))[0]
    want = {"PASS": 0, "FAIL": 4, "WARN": 0, "INCONCLUSIVE": 5}.get(str(verdict))
    add("8 accept", f"{ran('accept')}; profile {aj.get('profile')}; verdict {verdict}; "
        f"{(picked.group(0)[:120] if picked else '')}",
        "a profile picked from the GPU with its reason; a verdict whose exit code matches",
        want is not None and code == want)
else:
    add("8 accept", ran("accept"), "accept.json with a verdict", False)


def run_json(name: str) -> dict:
    d = run_dir(name)
    return json.loads((d / "run.json").read_text()) if d else {}


# 10: watch on the GPU
for name in ("watch", "watch-once"):
    rj, rs = run_json(name), csv_rows(name, "watch.csv")
    if not rj:
        add(f"10 {name}", ran(name), "run.json", False)
        continue
    uuid = str((rj.get("ranks") or [{}])[0].get("gpu_uuid"))
    ok = [r for r in rs if r["status"] == "ok"]
    times = sorted(num(r["time_us"]) for r in ok)
    verdicts = sorted({r["verdict"] for r in rs})
    fig = (f"{ran(name)}; status {rj.get('status')}; rank 0 on {uuid}; {len(ok)}/{len(rs)} "
           f"probe rows ok, {times[0] if times else float('nan'):.1f}-"
           f"{times[-1] if times else float('nan'):.1f} us; verdicts {', '.join(verdicts)}")
    expected = "exit 0, every probe measured on the GPU, its UUID in run.json"
    good = RC.get(name, (None,))[0] == 0 and uuid.startswith("GPU-") and bool(rs) \
        and len(ok) == len(rs)
    if name == "watch":
        prom = W / "prom" / "node.prom"
        text = prom.read_text() if prom.exists() else ""
        fig += f"; textfile {'written' if 'distbench_up' in text else 'missing'}"
        expected += "; the textfile written"
        good = good and "distbench_up" in text
    else:
        expected += "; judged against the first run: verdict ok"
        good = good and verdicts == ["ok"]
    add(f"10 {name}", fig, expected, good)

# 11: gloo runs on a host with a GPU
for name, file in (("gloo-collective", "collective.csv"), ("gloo-dp", "dp.csv"),
                   ("gloo-step", "step.csv"), ("gloo-watch", "watch.csv")):
    rs = csv_rows(name, file)
    ok = [r for r in rs if r["status"] == "ok"]
    add(f"11 {name}", f"{ran(name)}; {len(ok)}/{len(rs)} rows ok",
        "gloo workers on a GPU host: exit 0, every row ok",
        RC.get(name, (None,))[0] == 0 and bool(rs) and len(ok) == len(rs))

print("| item | figure | expected | result |")
print("|---|---|---|---|")
for row in rows:
    print("| " + " | ".join(c.replace("|", "/").replace("\n", " ") for c in row) + " |")

"""`watch`'s textfile read the way Prometheus reads it: through the real prometheus-node-exporter
(Debian's package, tests/exporter.py), its textfile collector, and /metrics over HTTP. Skips,
saying why, where there is no exporter (`make node-exporter` fetches it; .ci/run does)."""

from __future__ import annotations

import csv
import json
import re
import threading
import time
from datetime import datetime
from pathlib import Path

import helpers
import pytest
from exporter import binary, node_exporter
from prometheus_client import CollectorRegistry, write_to_textfile
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.parser import text_string_to_metric_families

from distbench.kinds import commands
from distbench.kinds.watch import metrics
from distbench.kinds.watch.records import STATES

EXPORTER, WHY_NOT = binary()
needs_exporter = pytest.mark.skipif(EXPORTER is None, reason=WHY_NOT)
BY_NAME = {m.name: m for m in metrics.ALL}

Samples = dict[tuple[str, frozenset], float]  # (sample name, its labels) -> value


def distbench_samples(text: str) -> tuple[Samples, dict[str, str]]:
    """Every distbench_* sample a scrape holds, and each family's HELP by sample name."""
    samples: Samples = {}
    helps: dict[str, str] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.startswith("distbench_"):
                key = (s.name, frozenset(s.labels.items()))
                assert key not in samples, f"{key} scraped twice"
                samples[key] = s.value
                helps[s.name] = family.documentation
    return samples, helps


class _Written:
    """A collector of fixed samples, named and typed as metrics.ALL says. Counters are built
    as families without a creation time: prometheus_client's Counter would add a
    `<name>_created` series that metrics.ALL does not export."""

    def __init__(self, samples: dict[metrics.PromMetric, list[tuple[dict[str, str], float]]]):
        self.samples = samples

    def collect(self):
        for m, rows in self.samples.items():
            kind = CounterMetricFamily if m.kind == "counter" else GaugeMetricFamily
            family = kind(m.name, m.help, labels=m.labels)
            for labels, value in rows:
                family.add_metric([labels[k] for k in m.labels], value)
            yield family


@needs_exporter
@pytest.mark.procs(1)
def test_a_textfile_written_with_prometheus_client_is_scraped_with_its_values(tmp_path):
    probe = {"op": "all_reduce", "size": "1048576", "scope": "cluster"}
    rank = {"rank": "1", "Hostname": "node-a", "gpu": "3",
            "UUID": "GPU-8d2f6c1e-0000-4000-8000-000000000001"}
    written = {
        metrics.BUSBW: [(probe, 2.58e9), ({**probe, "size": "1024"}, 1234.5)],
        metrics.TIME: [(probe, 812e-6)],
        metrics.STRAGGLER: [(rank, 1.0), ({**rank, "rank": "0", "gpu": "2"}, 0.0)],
        metrics.VERDICT: [({"state": s}, float(s == "warn")) for s in STATES],
        metrics.LAST_CYCLE: [({}, 1795720066.125)],
        metrics.CYCLES: [({}, 5.0)],
    }
    assert all(tuple(labels) == m.labels for m, rows in written.items() for labels, _ in rows)
    registry = CollectorRegistry()
    registry.register(_Written(written))
    write_to_textfile(str(tmp_path / "distbench.prom"), registry)  # atomic: tmp file, rename

    with node_exporter(tmp_path) as exporter:
        scraped, helps = distbench_samples(exporter.scrape())

    expected = {(m.name, frozenset(labels.items())): value
                for m, rows in written.items() for labels, value in rows}
    assert scraped == expected
    assert helps == {m.name: m.help for m in written}


def _parse_utc(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _numbers(cell: str) -> list[float]:
    """rank_time_us's cell, however the list is spelt in the CSV ("[800.0, 812.0]", "800;812")."""
    return [float(x) for x in re.findall(r"[-+]?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?", cell)]


# The CSV writes floats to 6 significant digits (results.writer.csv_cell); the textfile, in full
CSV_REL = 1e-5


def _expected_from_run(run_dir: Path) -> tuple[Samples, dict[str, float]]:
    """What the textfile must carry after the run, from watch.csv's last cycle (and watch.jsonl's
    last line for what the CSV has no column for: the stragglers and late counts), as exact
    values and as relative tolerances by sample name."""
    with open(run_dir / "watch.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    cycles = sorted({int(r["cycle"]) for r in rows})
    assert cycles == list(range(5)), f"cycles in watch.csv: {cycles}"
    last = [r for r in rows if int(r["cycle"]) == cycles[-1]]
    line = json.loads((run_dir / "watch.jsonl").read_text().splitlines()[-1])
    assert line["cycle"] == cycles[-1]

    exp: Samples = {}
    tol: dict[str, float] = {}

    def put(m: metrics.PromMetric, labels: dict[str, str], value: float, rel: float = 0.0):
        assert set(labels) == set(m.labels), (m.name, labels)
        exp[(m.name, frozenset(labels.items()))] = value
        tol[m.name] = rel

    for r in last:
        probe = {"op": r["op"], "size": r["size_bytes"], "scope": r["scope"]}
        put(metrics.BUSBW, probe, float(r["busbw_gbps"]) * 1e9, CSV_REL)
        put(metrics.TIME, probe, float(r["time_us"]) * 1e-6, CSV_REL)
        put(metrics.SPREAD, probe, float(r["spread_pct"]) / 100, CSV_REL)
        for s in STATES:
            put(metrics.PROBE_STATE, {**probe, "state": s}, float(s == r["state"]))
    for s in STATES:
        put(metrics.VERDICT, {"state": s}, float(s == last[0]["verdict"]))
    # the end of the last cycle: `started` may be to the second
    put(metrics.LAST_CYCLE, {}, _parse_utc(last[0]["started"]) + float(last[0]["duration_s"]))
    put(metrics.CYCLE_DURATION, {}, float(last[0]["duration_s"]), CSV_REL)
    put(metrics.INTERVAL, {}, 2.0)
    put(metrics.CYCLES, {}, float(len(cycles)))
    late = {int(r["cycle"]) for r in rows if r["late"] in ("1", "true", "True")}
    put(metrics.LATE, {}, float(len(late)))
    return exp, tol


def _rank_samples(scraped: Samples, m: metrics.PromMetric) -> dict[int, tuple[dict, float]]:
    found = {}
    for (name, labels), value in scraped.items():
        if name == m.name:
            found[int(dict(labels)["rank"])] = (dict(labels), value)
    return found


@needs_exporter
@pytest.mark.skipif("watch" not in commands(),
                    reason="no `distbench watch` on this branch yet (issue 32): written against "
                           "its contract, for the lead to run once it is merged")
@pytest.mark.procs(4)  # the exporter, and watch's launcher and 2 workers
def test_watch_textfile_through_the_real_exporter_carries_watch_csv_last_cycle(tmp_path):
    """Issue 32's Done-when: `distbench watch --interval 2 --count 5 --workers 2 --textfile`,
    scraped through the exporter while it runs (distbench_up 1) and once it has ended
    (distbench_up 0: an ended run must not read healthy), every metric of metrics.ALL present
    with watch.csv's last cycle's values, and no distbench series that ALL does not name."""
    textfiles, out = tmp_path / "textfile", tmp_path / "results"
    textfiles.mkdir()
    out.mkdir()
    result: list[helpers.Run] = []
    run = threading.Thread(target=lambda: result.append(helpers.distbench(
        out, "watch", "--interval", "2", "--count", "5", "--workers", "2",
        "--textfile", str(textfiles / "distbench.prom"), timeout=240)))
    up_seen: list[float] = []
    last_healthy = None  # the last scrape while watch ran: its last cycle's file
    with node_exporter(textfiles) as exporter:
        run.start()
        while run.is_alive():
            scraped, said = distbench_samples(exporter.scrape())
            ups = [v for (name, _), v in scraped.items() if name == metrics.UP.name]
            up_seen += ups
            if ups == [1.0]:
                last_healthy, helps = scraped, said
            time.sleep(0.25)
        run.join()
        ended, _ = distbench_samples(exporter.scrape())

    assert result, "the watch run raised (see the thread's traceback above)"
    r = result[0]
    line = json.loads((r.run_dir / "watch.jsonl").read_text().splitlines()[-1])
    # 5 cycles judge nothing at the default --warm (judge.WARM): inconclusive, not a pass
    want = {"ok": 0, "warn": 4, "fail": 4, "unknown": 5}[line["verdict"]]
    assert r.code == want, f"rc={r.code}\n{r.stdout}\n{r.stderr}"
    assert 1.0 in up_seen, f"distbench_up never read 1 while watch ran: {up_seen}"
    # the run ended: the file no longer reads healthy, and holds no stale measurement
    assert [v for (n, _), v in ended.items() if n == metrics.UP.name] == [0.0]
    assert not {n for n, _ in ended} & {metrics.BUSBW.name, metrics.TIME.name,
                                         metrics.SPREAD.name, metrics.STRAGGLER.name}
    assert last_healthy is not None
    final = last_healthy

    assert {name for name, _ in final} <= set(BY_NAME), \
        f"series metrics.ALL does not name: {sorted({n for n, _ in final} - set(BY_NAME))}"
    assert {name for name, _ in final} == set(BY_NAME), \
        f"metrics.ALL's metrics missing: {sorted(set(BY_NAME) - {n for n, _ in final})}"
    assert helps == {m.name: m.help for m in metrics.ALL}

    ups = [(dict(labels), v) for (name, labels), v in final.items() if name == metrics.UP.name]
    assert len(ups) == 1 and ups[0][1] == 1.0, ups
    hostname = ups[0][0]["Hostname"]

    expected, tol = _expected_from_run(r.run_dir)
    for key, value in expected.items():
        assert key in final, f"{key} not scraped; scraped: {sorted(final)}"
        if key[0] == metrics.LAST_CYCLE.name:
            assert abs(final[key] - value) <= 1.0, (key, final[key], value)
        else:
            assert final[key] == pytest.approx(value, rel=tol[key[0]], abs=0), key

    for m, want in ((metrics.STRAGGLER, lambda k: float(k in line["stragglers"])),
                    (metrics.LATE_CYCLES, lambda k: float(line["late_counts"].get(str(k), 0)))):
        by_rank = _rank_samples(final, m)
        assert sorted(by_rank) == [0, 1], (m.name, by_rank)
        for k, (labels, value) in by_rank.items():
            assert labels["Hostname"] == hostname, (m.name, labels)
            assert value == want(k), (m.name, k, value, line)

    probe_series = {k for k in final if k[0] in (metrics.BUSBW.name, metrics.TIME.name,
                                                  metrics.SPREAD.name, metrics.PROBE_STATE.name)}
    assert probe_series <= set(expected), f"probes not in watch.csv's last cycle: " \
        f"{sorted(probe_series - set(expected))}"

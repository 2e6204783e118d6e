"""The node_exporter textfile: this node's metrics after each cycle, and the file that says the
watch is down. Torch-free.

Written with prometheus_client's write_to_textfile, which writes a temporary file beside the
target and renames it over: node_exporter never reads half a file. Every metric comes from
metrics.ALL (name, kind, help, labels); none is spelled here. Values are given, not counted in
this process (the loop counts cycles), so the metrics are metric families yielded by a collector,
not Counter objects: those add a `_created` series no dashboard asked for.

A file that reads healthy must mean a fresh, measuring watch. write_down is what the loop (or
whoever finds it dead) leaves instead: distbench_up 0, the verdict "unknown", and no busbw, time
or straggler value, since a stale busbw would still plot as a healthy fabric."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from prometheus_client import CollectorRegistry, write_to_textfile
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from distbench.kinds.watch import metrics
from distbench.kinds.watch.records import STATES, Cycle, Judgement, RankInfo

WHY_CHARS = 200  # how much of write_down's reason goes into distbench_up's help


class _Family:
    """One metrics.PromMetric's samples, gathered before they are written."""

    def __init__(self, metric: metrics.PromMetric, help_text: str | None = None) -> None:
        kind = {"gauge": GaugeMetricFamily, "counter": CounterMetricFamily}[metric.kind]
        self.metric = metric
        self.family = kind(metric.name, help_text or metric.help, labels=metric.labels)

    def add(self, value: float | None, **labels: str) -> None:
        if value is None:  # nothing known: no sample, never a 0 that reads as a measurement
            return
        if set(labels) != set(self.metric.labels):
            raise ValueError(f"{self.metric.name} takes labels {self.metric.labels}, "
                             f"got {sorted(labels)}")
        self.family.add_metric([labels[k] for k in self.metric.labels], float(value))


class _Collector:
    def __init__(self, families: list[_Family]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        for f in self.families:
            yield f.family


def _write(path: str | Path, families: list[_Family]) -> None:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(families))
    write_to_textfile(str(path), registry)


def _one_hot(family: _Family, state: str, **labels: str) -> None:
    if state not in STATES:
        raise ValueError(f"state {state!r} is not one of {STATES}")
    for s in STATES:
        family.add(1.0 if s == state else 0.0, state=s, **labels)


def write(path: str | Path, judgement: Judgement, cycle: Cycle, ranks: list[RankInfo], *,
          hostname: str, interval_s: float, cycles_total: int, late_total: int) -> None:
    """Every metric of metrics.ALL for this node after `cycle`: `ranks` are the node's own
    (their straggler state and late cycles); the probes' figures are the cluster's."""
    f = {m.name: _Family(m) for m in metrics.ALL}
    f[metrics.UP.name].add(1, Hostname=hostname)
    f[metrics.ENDED.name].add(0, Hostname=hostname)
    for r in cycle.results:
        labels = r.probe.labels()
        f[metrics.BUSBW.name].add(None if r.busbw_gbps is None else r.busbw_gbps * 1e9, **labels)
        f[metrics.TIME.name].add(None if r.time_us is None else r.time_us / 1e6, **labels)
        f[metrics.SPREAD.name].add(r.spread, **labels)
        state = judgement.probes.get(r.probe.key)
        _one_hot(f[metrics.PROBE_STATE.name], state.state if state else "unknown", **labels)
    _one_hot(f[metrics.VERDICT.name], judgement.verdict)
    _one_hot(f[metrics.LAST_VERDICT.name], judgement.verdict)
    for info in ranks:
        f[metrics.STRAGGLER.name].add(info.rank in judgement.stragglers, **info.labels())
        f[metrics.LATE_CYCLES.name].add(judgement.late_counts.get(info.rank, 0), **info.labels())
    f[metrics.LAST_CYCLE.name].add(cycle.started + cycle.duration_s)
    f[metrics.CYCLE_DURATION.name].add(cycle.duration_s)
    f[metrics.INTERVAL.name].add(interval_s)
    f[metrics.CYCLES.name].add(cycles_total)
    f[metrics.LATE.name].add(late_total)
    _write(path, list(f.values()))


def write_down(path: str | Path, *, hostname: str, why: str = "", ended: bool = False,
               last_verdict: str | None = None) -> None:
    """The file that says this node's watch is not measuring: up 0, the verdict "unknown", no
    measurement. `ended`: it ended as asked (distbench_ended 1), which the shipped alert rules
    do not alert on; else it was lost. `last_verdict`, where one was reached, stays in its own
    metric. `why` (one line, bounded) goes into distbench_up's help, the one free text a
    textfile carries."""
    reason = " ".join(why.split())[:WHY_CHARS]
    up = _Family(metrics.UP, f"{metrics.UP.help} (down: {reason})" if reason else None)
    up.add(0, Hostname=hostname)
    end = _Family(metrics.ENDED)
    end.add(int(ended), Hostname=hostname)
    verdict = _Family(metrics.VERDICT)
    _one_hot(verdict, "unknown")
    families = [up, end, verdict]
    if last_verdict is not None:
        last = _Family(metrics.LAST_VERDICT)
        _one_hot(last, last_verdict)
        families.append(last)
    _write(path, families)

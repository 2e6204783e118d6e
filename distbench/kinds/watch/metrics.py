"""The Prometheus metrics `watch` exports, in one place: the textfile is written from these, the
Grafana dashboard (configs/grafana/distbench-watch.json) may query only these, and a test holds
both. Names follow Prometheus' conventions (base units, `_total` for counters)."""

from __future__ import annotations

from dataclasses import dataclass

PROBE_LABELS = ("op", "size", "scope")  # records.Probe.labels
RANK_LABELS = ("rank", "Hostname", "gpu", "UUID")  # records.RankInfo.labels: DCGM's join keys


@dataclass(frozen=True)
class PromMetric:
    """A Prometheus metric watch exports (results.compare.Metric is what compare judges)."""

    name: str
    kind: str  # "gauge" or "counter"
    help: str
    labels: tuple[str, ...] = ()


UP = PromMetric("distbench_up", "gauge",
                "1 while watch runs and its last cycle is fresh; 0 once it ended, lost a rank, "
                "or stopped measuring", ("Hostname",))
# A deliberate end (--count, --duration, --once, or a SIGTERM or SIGINT: an operator's stop,
# scancel) told apart from a lost watch, so an alert fires for the second only.
ENDED = PromMetric("distbench_ended", "gauge",
                   "1 once the watch ended as asked (--count, --duration, --once, SIGTERM or "
                   "SIGINT); 0 while it runs and when it went down otherwise (a rank lost, a "
                   "failure, a timeout)", ("Hostname",))
LAST_VERDICT = PromMetric("distbench_last_verdict", "gauge",
                          "1 for the last verdict the watch reached (ok, warn, fail, unknown), "
                          "kept after it ends; else 0", ("state",))
BUSBW = PromMetric("distbench_busbw_bytes_per_second", "gauge",
                   "Bus bandwidth of the probe in the last cycle (nccl-tests' busbw)", PROBE_LABELS)
TIME = PromMetric("distbench_time_seconds", "gauge",
                  "Time of one probe op in the last cycle, the slowest rank's", PROBE_LABELS)
SPREAD = PromMetric("distbench_rank_spread_ratio", "gauge",
                    "Slowest rank's time over the fastest's, less 1, in the last cycle",
                    PROBE_LABELS)
PROBE_STATE = PromMetric("distbench_probe_state", "gauge",
                         "1 for the probe's current state (ok, warn, fail, unknown), else 0",
                         PROBE_LABELS + ("state",))
VERDICT = PromMetric("distbench_verdict", "gauge",
                     "1 for the watch's current verdict (ok, warn, fail, unknown), else 0",
                     ("state",))
STRAGGLER = PromMetric("distbench_straggler", "gauge",
                       "1 where the rank is named a straggler (the others waited for it in k of "
                       "the last n cycles)", RANK_LABELS)
LATE_CYCLES = PromMetric("distbench_rank_late_cycles", "gauge",
                         "Cycles of the last n in which the others waited for the rank",
                         RANK_LABELS)
LAST_CYCLE = PromMetric("distbench_last_cycle_timestamp_seconds", "gauge",
                        "When the last cycle ended, unix seconds")
CYCLE_DURATION = PromMetric("distbench_cycle_duration_seconds", "gauge",
                            "How long the last cycle took")
INTERVAL = PromMetric("distbench_interval_seconds", "gauge",
                      "The cycle interval asked (--interval)")
CYCLES = PromMetric("distbench_cycles_total", "counter", "Cycles measured")
LATE = PromMetric("distbench_late_cycles_total", "counter",
                  "Cycles that took longer than the interval")

ALL = (UP, ENDED, LAST_VERDICT, BUSBW, TIME, SPREAD, PROBE_STATE, VERDICT, STRAGGLER,
       LATE_CYCLES, LAST_CYCLE, CYCLE_DURATION, INTERVAL, CYCLES, LATE)

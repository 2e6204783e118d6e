"""watch's Prometheus textfile, read back with prometheus_client's own parser: every metric of
metrics.ALL under its exact name and labels, the values of the cycle, and a down file that
cannot read healthy."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from distbench.kinds.watch import metrics, textfile
from distbench.kinds.watch.records import (
    STATES,
    Cycle,
    Judgement,
    Probe,
    ProbeResult,
    ProbeState,
    RankInfo,
)

AR = Probe("all_reduce", 1 << 20)
AG = Probe("all_gather", 1 << 16)
RANKS = [RankInfo(0, "gpu7", "0", "GPU-aaaa"), RankInfo(1, "gpu7", "1", "GPU-bbbb")]


def samples(path: Path) -> dict[str, list[tuple[dict[str, str], float]]]:
    """sample name -> [(labels, value)]."""
    out: dict[str, list] = {}
    for family in text_string_to_metric_families(path.read_text()):
        for s in family.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def value(got, name: str, **labels: str) -> float:
    found = [v for lab, v in got[name] if lab == labels]
    assert len(found) == 1, (name, labels, got[name])
    return found[0]


def written(tmp_path: Path) -> Path:
    cycle = Cycle(7, 1_800_000_000.0, 0.8, True, (
        ProbeResult(AR, "ok", 812.0, 2.58, (812.0, 400.0)),
        ProbeResult(AG, "failed", note="timed out")))
    judgement = Judgement({AR.key: ProbeState("warn", 800.0, 900.0, 0.1, 700.0),
                           AG.key: ProbeState("fail")},
                          "fail", stragglers=(1,), late_counts={1: 3})
    path = tmp_path / "distbench.prom"
    textfile.write(path, judgement, cycle, RANKS, hostname="gpu7", interval_s=2.0,
                   cycles_total=8, late_total=1)
    return path


def test_every_metric_is_written_under_its_exact_name(tmp_path):
    got = samples(written(tmp_path))
    assert set(got) == {m.name for m in metrics.ALL}  # counters keep their _total, no _created
    text = written(tmp_path).read_text()
    for m in metrics.ALL:
        assert f"# TYPE {m.name} {m.kind}" in text or \
            f"# TYPE {m.name.removesuffix('_total')} {m.kind}" in text
        for labels, _ in got[m.name]:
            assert set(labels) == set(m.labels)


def test_values_are_the_cycles(tmp_path):
    got = samples(written(tmp_path))
    ar = AR.labels()
    assert value(got, metrics.UP.name, Hostname="gpu7") == 1
    assert value(got, metrics.BUSBW.name, **ar) == pytest.approx(2.58e9)
    assert value(got, metrics.TIME.name, **ar) == pytest.approx(812e-6)
    assert value(got, metrics.SPREAD.name, **ar) == pytest.approx(812 / 400 - 1)
    # a failed probe has no figures, only its state
    assert [lab["op"] for lab, _ in got[metrics.BUSBW.name]] == ["all_reduce"]
    for probe, state in ((AR, "warn"), (AG, "fail")):
        hot = {s: value(got, metrics.PROBE_STATE.name, state=s, **probe.labels())
               for s in STATES}
        assert hot == {s: float(s == state) for s in STATES}
    assert {s: value(got, metrics.VERDICT.name, state=s) for s in STATES} == \
        {"ok": 0, "warn": 0, "fail": 1, "unknown": 0}
    assert value(got, metrics.STRAGGLER.name, **RANKS[1].labels()) == 1
    assert value(got, metrics.STRAGGLER.name, **RANKS[0].labels()) == 0
    assert value(got, metrics.LATE_CYCLES.name, **RANKS[1].labels()) == 3
    assert value(got, metrics.LATE_CYCLES.name, **RANKS[0].labels()) == 0
    assert value(got, metrics.LAST_CYCLE.name) == pytest.approx(1_800_000_000.8)
    assert value(got, metrics.CYCLE_DURATION.name) == pytest.approx(0.8)
    assert value(got, metrics.INTERVAL.name) == 2.0
    assert value(got, metrics.CYCLES.name) == 8
    assert value(got, metrics.LATE.name) == 1


def test_down_after_write_leaves_nothing_that_reads_healthy(tmp_path):
    path = written(tmp_path)
    textfile.write_down(path, hostname="gpu7", why="rank 1 lost:\n timed out after 60 s")
    got = samples(path)
    assert value(got, metrics.UP.name, Hostname="gpu7") == 0
    assert {s: value(got, metrics.VERDICT.name, state=s) for s in STATES} == \
        {"ok": 0, "warn": 0, "fail": 0, "unknown": 1}
    for stale in (metrics.BUSBW, metrics.TIME, metrics.SPREAD, metrics.PROBE_STATE,
                  metrics.STRAGGLER):
        assert stale.name not in got
    assert "(down: rank 1 lost: timed out after 60 s)" in path.read_text()


def test_a_running_watch_is_not_ended_and_its_last_verdict_is_the_verdict(tmp_path):
    got = samples(written(tmp_path))
    assert value(got, metrics.ENDED.name, Hostname="gpu7") == 0
    assert {s: value(got, metrics.LAST_VERDICT.name, state=s) for s in STATES} == \
        {"ok": 0, "warn": 0, "fail": 1, "unknown": 0}


@pytest.mark.parametrize("ended", [True, False])
def test_the_down_file_tells_a_deliberate_end_from_a_lost_watch(tmp_path, ended):
    """--count reached (or the operator's SIGTERM) against a lost rank: the alert rules fire for
    the second alone; the last verdict (a FAIL the run exited 4 on) stays readable."""
    path = written(tmp_path)
    textfile.write_down(path, hostname="gpu7", why="ended as asked after 8 cycles",
                        ended=ended, last_verdict="fail")
    got = samples(path)
    assert value(got, metrics.UP.name, Hostname="gpu7") == 0
    assert value(got, metrics.ENDED.name, Hostname="gpu7") == int(ended)
    assert {s: value(got, metrics.LAST_VERDICT.name, state=s) for s in STATES} == \
        {"ok": 0, "warn": 0, "fail": 1, "unknown": 0}
    assert value(got, metrics.VERDICT.name, state="unknown") == 1
    assert metrics.LAST_CYCLE.name not in got  # nothing for the staleness rule to age
    textfile.write_down(path, hostname="gpu7", why="starting")
    assert metrics.LAST_VERDICT.name not in samples(path)  # no verdict reached yet


def test_the_write_is_a_rename_of_a_file_beside_it(tmp_path, monkeypatch):
    """No partial file is ever visible at the path: the bytes go to a temporary file in the
    same directory (same filesystem, so the rename is atomic) and are renamed over it."""
    path = written(tmp_path)
    before = path.read_text()
    renames = []
    real = os.rename

    def rename(src, dst):
        renames.append((src, dst, Path(src).read_text()))
        assert path.read_text() == before  # the old file stays whole until the rename
        real(src, dst)

    monkeypatch.setattr(os, "rename", rename)
    textfile.write_down(path, hostname="gpu7")
    (src, dst, body), = renames
    assert Path(src).parent == path.parent and dst == str(path)
    assert path.read_text() == body and sorted(p.name for p in tmp_path.iterdir()) == [path.name]


def test_an_unknown_state_is_refused_before_anything_is_written(tmp_path):
    path = tmp_path / "x.prom"
    cycle = Cycle(0, 0.0, 0.1, False, ())
    with pytest.raises(ValueError, match="not one of"):
        textfile.write(path, Judgement({}, "bad"), cycle, [], hostname="h", interval_s=1,
                       cycles_total=1, late_total=0)
    assert not path.exists()

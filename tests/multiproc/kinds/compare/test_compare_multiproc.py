"""compare --baseline at the end of a real collective and p2p run. The rest of compare, on
synthetic runs: test_compare.py."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
from compare_helpers import SWEEP, _plain_and_slowed
from helpers import distbench
from runs import matrix_row, p2p_row, times, write_meta, write_table

from distbench.kinds.p2p.output import MATRIX_OUTPUT as P2P_MATRIX
from distbench.kinds.p2p.output import OUTPUT as P2P_OUTPUT
from distbench.results import compare, reader


# The one real run of the gate at the end of a sweep (bench.baseline_gate, on every rank): the
# comparison's rules are the tests above, on runs written by hand. Alone: a slowdown on the
# machine during the run is what the gate is there to see.
@pytest.mark.multiproc
# Not alone: the fault (20 ms an op, 10-20x the op) is caught whatever runs beside; the A/A
# side of the rule is benchmarks/false_alarms.py's, on a quiet machine.
def test_baseline_at_the_end_of_a_run(tmp_path):
    plain, _ = _plain_and_slowed(tmp_path / "given")
    out = tmp_path / "new"
    out.mkdir()
    res = distbench(out, "collective", "--op", "all_reduce,all_gather", *SWEEP,
                    "--warmup", "2", "--workers", "2", "--baseline", str(plain),
                    DISTBENCH_TEST_SLOW_RANK="0:0.02")
    assert res.code == 4, res.stderr
    assert "rows worse than --baseline by more than 5% and beyond the noise" in res.stderr
    assert f"BASE {plain.name} vs NEW {res.run_dir.name}" in res.stdout
    meta = json.loads((res.run_dir / "run.json").read_text())
    assert (meta["status"], meta["exit_code"]) == ("below_expectation", 4)
    assert meta["baseline"]["rows"] == 6 and meta["baseline"]["worse"] >= 3
    assert meta["baseline"]["worse"] == len(
        compare.compare(reader.load(plain), reader.load(res.run_dir)).worse)
    assert len(res.rows("collective.csv")) == 6  # every row kept


def _p2p_base(where: Path) -> Path:
    """What `p2p --pattern ring,matrix --sizes 4K,64K --min-time 0.3 --workers 2` measures on
    this machine: gloo at 4-64 KiB takes 0.1-0.5 ms an op here."""
    host = socket.gethostname()
    ring = [p2p_row("ring", size) for size in (4096, 65536)]
    links = [matrix_row(d, s, t, size, host=host) for size in (4096, 65536)
             for d, s, t in (("uni", 0, 1), ("uni", 1, 0), ("bi", 0, 1))]
    write_table(where, P2P_OUTPUT, ring, [times(150.0 + 250 * i, seed=i, spread=0.3)
                                          for i in range(len(ring))])
    write_table(where, P2P_MATRIX, links, [times(150.0 + 50 * i, seed=10 + i, spread=0.3)
                                           for i in range(len(links))])
    return write_meta(where, "p2p")


# The one real run of p2p's gate: a slowed run against a baseline written as this machine
# measures (_p2p_base). Alone: see test_baseline_at_the_end_of_a_run.
@pytest.mark.multiproc
def test_p2p_baseline_compares_the_ring_and_the_matrix(tmp_path):
    # Each row at least 0.3 s, so each of its 5 repetitions at least 60 ms: gloo at 4-64 KiB
    # takes 0.1-0.5 ms an op here and now and then stalls for tens of ms, which made a
    # repetition of a few ops 15-28x its peers and left its row noisy (fixed iterations: 1 row
    # in 11 at 50, and the ring's only row in 1 run of 3 at 20; 0 rows in 64 at 0.3 s, measured
    # 2026-11-25). A rank slowed 10 ms an op is 20-100x slower.
    args = ("p2p", "--pattern", "ring,matrix", "--sizes", "4K,64K", "--min-time", "0.3",
            "--warmup", "2", "--workers", "2")
    base = _p2p_base(tmp_path / "given")
    (tmp_path / "new").mkdir()
    # rank 1 slow both ways: the ring and both directions of its one link
    res = distbench(tmp_path / "new", *args, "--baseline", str(base),
                    DISTBENCH_TEST_SLOW_RANK="1:0.01")
    assert res.code == 4, res.stderr
    c = compare.compare(reader.load(base), reader.load(res.run_dir))
    assert {r.file for r in c.worse} == {"p2p.csv", "p2p_matrix.csv"}
    # per size, the ring; matrix: 0->1 and 1->0 one way, 0<->1 both ways (measured once per
    # pair); a row not called worse is one whose repetitions are too far apart to tell, never
    # the same
    assert len(c.rows) == 2 * 4 and len(c.worse) >= 4
    assert all(r.mark == "-" or r.note.startswith("within the noise") for r in c.rows), c.rows
    assert res.meta()["baseline"]["worse"] == len(c.worse)

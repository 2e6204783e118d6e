"""Where a launcher puts ranks: `srun` fills node 0 first by default (block: ranks 0,1 on node 0,
2,3 on node 1), `srun -m cyclic` deals them out (0,2 on node 0, 1,3 on node 1), and so does
`mpirun --map-by node`. A node's ranks are then not consecutive, and a pair's group is not the
two nodes' ranks laid end to end: torch sorts a new group's ranks. `distbench accept` must
measure its pair checks under every placement, as block placement does.

Four ranks started by hand on this machine, with the variables Slurm and Open MPI set: Slurm's
SLURM_NODEID says the node; Open MPI gives no node index (every rank is on "this machine"), so
the test hook DISTBENCH_TEST_HOST says which node each rank believes it runs on. The profile is
tests/fixtures/profiles/two-node-floors.toml: on two nodes cpu-gloo's pair checks have no
healthy peers to be judged against (INCONCLUSIVE, exit 5), the fixture's absolute floors are
passed by any measurement that moved data. One test runs cpu-gloo's own pair checks, and is
inconclusive. The tests that start processes: test_placement_multiproc.py."""

from __future__ import annotations

from distbench.run.faults import fake_host


def test_a_fake_host_changes_the_grouping_only():
    assert fake_host({"DISTBENCH_TEST_HOST": "node0"}) != fake_host(
        {"DISTBENCH_TEST_HOST": "node1"})
    assert fake_host({}) == ""  # without the hook: no change

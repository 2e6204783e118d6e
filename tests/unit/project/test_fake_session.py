"""tests/fake_session.py stands in for a Session: each thing it offers a command body is
something the real Session has, so a body that passes on the fake reads nothing a real run
lacks."""

from __future__ import annotations

import inspect

from fake_session import FakeSession, fake_runtime

from distbench.run.session import Session

# What the fake keeps for the tests to read, and the real one has no need of.
TEST_SIDE = {"phases", "failures", "close_sinks"}


def _public(names) -> set[str]:
    return {n for n in names if not n.startswith("_")}


def test_the_fake_offers_only_what_a_session_has():
    fake = FakeSession()
    offered = _public(dir(fake)) - TEST_SIDE
    # the real one's attributes are set in __init__: read them from its source
    source = inspect.getsource(Session.__init__)
    real = _public(dir(Session)) | {n for n in _public(vars(fake)) if f"self.{n} =" in source
                                    or f"self.{n}:" in source}
    assert offered <= real, sorted(offered - real)


def test_the_fake_runtime_counts_its_nodes_from_its_ranks():
    rt = fake_runtime(3, 4, nnodes=2)
    assert (rt.rank, rt.world, rt.nnodes, rt.local_rank) == (3, 4, 2, 1)
    assert [r["node"] for r in rt.ranks] == [0, 0, 1, 1]

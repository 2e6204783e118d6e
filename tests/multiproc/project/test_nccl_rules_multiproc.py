"""The NCCL-rules checker on a real 2-stage 1F1B pipeline replayed on gloo workers. The
synthetic traces: test_nccl_rules.py."""

from __future__ import annotations

import helpers
import nccl_rules
import pytest
from paths import TESTS


@pytest.mark.procs(3)
def test_the_old_unbatched_replay_is_caught_and_the_batched_one_passes(tmp_path):
    """A real 2-stage 1F1B step with 4 micro-batches on gloo, its sends and receives counted and
    replayed alone under the recorder: op by op (the replay before issue 30, which gloo ran)
    would hang on NCCL; replay_p2p's batches would not."""
    for mode in ("unbatched", "batched"):
        done = helpers.torchrun_nodes(tmp_path, 1, 2, [[mode]],
                                      script=(str(TESTS / "replay_worker.py"),))
        assert done[0].returncode == 0, done[0].stderr[-2000:]
    unbatched = nccl_rules.check(tmp_path / "unbatched")
    assert len(unbatched) == 1 and unbatched[0].startswith("would hang on NCCL"), unbatched
    assert "send of 65536 B float32 to rank 1" in unbatched[0]
    assert "send of 65536 B float32 to rank 0" in unbatched[0]
    traced = nccl_rules.read(tmp_path / "batched")
    assert {e["op"] for t in traced.values() for e in t.events} == {"send", "recv"}
    assert nccl_rules.check(tmp_path / "batched") == []

"""One rank of a 2-stage 1F1B pipeline (4 micro-batches) whose sends and receives are counted in
one step, then replayed alone while the rank's posts are recorded (distbench.run.comm_trace):
`batched` replays them as steps.comms.replay_p2p does, `unbatched` as it did before issue 30,
each op posted alone and all waited for at the end. Run under torchrun by test_nccl_rules.py:
`replay_worker.py batched|unbatched --out DIR`; the traces go to DIR/<mode>."""

import sys
from pathlib import Path

import torch
import torch.distributed as dist

from distbench.planner.layouts import Layout
from distbench.planner.models import PRESETS
from distbench.run.comm_trace import Recorder
from distbench.steps import mesh_model
from distbench.steps.comms import CommCounter, replay_p2p


def unbatched_replay(calls, device, group):
    """The replay before issue 30: each send and receive posted alone, in the step's order,
    none waited for until all were posted."""
    buffers, posts = {}, []
    for c in calls:
        if c.op not in ("send", "recv") or c.dtype is None:
            continue
        key = (c.size_bytes // c.dtype.itemsize, c.dtype)
        if key not in buffers:
            buffers[key] = torch.zeros(key[0], dtype=c.dtype, device=device)
        buf = buffers[key]
        if c.op == "send":
            posts.append(lambda b=buf, r=c.root: dist.isend(b, group=group, group_dst=r))
        else:
            posts.append(lambda b=buf, r=c.root: dist.irecv(b, group=group, group_src=r))

    def run():
        for work in [post() for post in posts]:
            work.wait()
    return run


def main() -> None:
    mode, out = sys.argv[1], Path(sys.argv[sys.argv.index("--out") + 1])
    dist.init_process_group("gloo")
    device = torch.device("cpu")
    model = PRESETS["toy"]
    mm = mesh_model.build(model, Layout(tp=1, pp=2, dp=1, micro_batches=4), device,
                          torch.float32)
    mm.step()  # the pipeline's first step infers its shapes: not the step counted
    with CommCounter() as counter:
        mm.step()
    group = mm.mesh["pp"].get_group()
    replay = (replay_p2p if mode == "batched" else unbatched_replay)(counter.calls, device, group)
    recorder = Recorder(dist.get_rank(), out / mode)
    with recorder:
        replay()
    recorder.dump(complete=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""Point-to-point patterns: ring (nccl-tests' sendrecv), ping-pong pairs, and one ordered pair
at a time for the link matrix. Received data is checked like the collectives' results. Ranks
are ranks of `group` (a node, a pair of nodes; None: every rank)."""

from __future__ import annotations

import torch
import torch.distributed as dist

from distbench.ops import data
from distbench.ops.case import Case, idle


def _exchange(ops: list[dist.P2POp]) -> None:
    # batched so NCCL posts both sides at once; gloo takes the same call
    for req in dist.batch_isend_irecv(ops):
        req.wait()


# One tensor each way, batched too: an unbatched send/recv makes NCCL set up a communicator of
# its own per pair on older torch, and makes newer torch warn on every rank that it serializes.
def _op(kind, tensor: torch.Tensor, peer: int, group=None) -> dist.P2POp:
    return dist.P2POp(kind, tensor, group=group, group_peer=peer)


def send(tensor: torch.Tensor, peer: int, group=None) -> None:
    _exchange([_op(dist.isend, tensor, peer, group)])


def recv(tensor: torch.Tensor, peer: int, group=None) -> None:
    _exchange([_op(dist.irecv, tensor, peer, group)])


def ring(rank: int, n: int, send: torch.Tensor, recv: torch.Tensor, group=None) -> Case:
    """Send to r+1 and receive from r-1 at once."""
    nxt, prev = (rank + 1) % n, (rank - 1) % n
    ops = [_op(dist.isend, send, nxt, group), _op(dist.irecv, recv, prev, group)]

    def prepare():
        data.fill_movement(send, rank)
        recv.fill_(data.SENTINEL)
    return Case(run=lambda: _exchange(ops), prepare=prepare,
                check=lambda: data.wrong_movement(recv, prev), output=recv)


def pingpong_partner(rank: int, n: int) -> int | None:
    """Rank i pairs with i + n//2, so on two nodes every pair crosses between them; with an odd
    world the last rank sits out."""
    half = n // 2
    if rank < half:
        return rank + half
    if rank < 2 * half:
        return rank - half
    return None


def pingpong(rank: int, n: int, buf: torch.Tensor, group=None) -> Case:
    """One round trip per call: the lower rank of a pair sends first and gets the message back."""
    partner = pingpong_partner(rank, n)
    if partner is None:
        return idle()
    first = rank < partner

    def run():
        if first:
            send(buf, partner, group)
            recv(buf, partner, group)
        else:
            recv(buf, partner, group)
            send(buf, partner, group)

    def prepare():
        if first:
            data.fill_movement(buf, rank)
        else:
            buf.fill_(data.SENTINEL)
    # the message that comes back is the one the first rank sent
    origin = rank if first else partner
    return Case(run=run, prepare=prepare, check=lambda: data.wrong_movement(buf, origin),
                output=buf)


def one_link(rank: int, src: int, dst: int, bidirectional: bool, send: torch.Tensor,
             recv: torch.Tensor, group=None) -> Case:
    """src sends to dst (and dst to src when bidirectional); every other rank sits out."""
    if rank not in (src, dst):
        return idle()
    peer = dst if rank == src else src
    sends = bidirectional or rank == src
    receives = bidirectional or rank == dst
    ops = ([_op(dist.isend, send, peer, group)] if sends else []) + (
        [_op(dist.irecv, recv, peer, group)] if receives else [])

    def prepare():
        data.fill_movement(send, rank)
        recv.fill_(data.SENTINEL)
    return Case(run=lambda: _exchange(ops), prepare=prepare,
                check=lambda: data.wrong_movement(recv, peer) if receives else 0,
                output=recv if receives else None, sends=sends, receives=receives)

"""The device meshes the steps run on: tp's one dimension over the world, a layout's (pp, dp, tp)
mesh, its process groups destroyed once the layout is done, and the world as FSDP2's mesh."""

from __future__ import annotations

import itertools

import torch
import torch.distributed as dist

from distbench.planner.layouts import Layout


def flat_mesh(device: torch.device, world: int):
    """One dimension over all `world` ranks."""
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(device.type, (world,))


def world_mesh(device: torch.device):
    """The default group as a mesh on `device`'s type: FSDP2 without a mesh makes one on torch's
    default accelerator, so on a GPU machine a gloo run's CPU model would be sharded onto cuda:0
    (seen on the first GPU, issue 34)."""
    from torch.distributed.device_mesh import DeviceMesh

    return DeviceMesh.from_group(dist.group.WORLD, device.type)


class FreshMesh:
    """A device mesh of its own, its dimensions reached by their plain names (mesh["tp"]), ended
    by release_groups. torch's DeviceMesh underneath names them uniquely ("tp3"): DTensor caches
    its sharding decisions keyed by a mesh's equality, which its shape and names decide, so a
    later mesh of the same shape would run its collectives on an earlier mesh's groups, which
    are destroyed by then ("Could not resolve the process group registered under the name 63")."""

    _made = itertools.count()

    def __init__(self, device: torch.device, dims: dict[str, int]):
        from torch.distributed.device_mesh import init_device_mesh

        k = next(FreshMesh._made)
        self.names = {d: f"{d}{k}" for d in dims}
        self.device_mesh = init_device_mesh(device.type, tuple(dims.values()),
                                            mesh_dim_names=tuple(self.names.values()))

    def __getitem__(self, dim: str):
        return self.device_mesh[self.names[dim]]


def layout_mesh(layout: Layout, device: torch.device) -> FreshMesh:
    """A fresh (pp, dp, tp) device mesh for `layout`, tp fastest (release_groups ends it)."""
    return FreshMesh(device, {"pp": layout.pp, "dp": layout.dp, "tp": layout.tp})


def release_groups(mesh: FreshMesh) -> None:
    """The mesh's process groups destroyed, once its layout is done: NCCL's communicators hold
    device memory the caching allocator does not see, and a sweep of layouts would otherwise
    keep every layout's. The default group, which a dimension spanning the whole world reuses,
    stays. Every rank calls it at the same point."""
    world = dist.group.WORLD
    for name in mesh.names:
        group = mesh[name].get_group()
        if group is not None and group is not world:
            dist.destroy_process_group(group)

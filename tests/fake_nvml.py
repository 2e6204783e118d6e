"""A faked pynvml (and no nvidia-smi) for topo's snapshot of a GPU machine without one: the
GPUs, their links and the errors NVML raises."""

import types

from distbench.platform import topo_probe


class _FakeNVMLError(Exception):
    pass


# Named like pynvml's generated subclasses, so the recorded "Class: message" line is the real one.
class NVMLError_NotSupported(_FakeNVMLError):
    def __init__(self):
        super().__init__("Not Supported")


_FAKE_NAMES = [b"NVIDIA H100 80GB HBM3", "NVIDIA L40S", "NVIDIA H100 80GB HBM3"]

_FAKE_MEMORY = [85520809984, 48305799168, 85520809984]

_FAKE_BUS_IDS = [b"00000000:18:00.0", "00000000:2A:00.0", b"00000000:3A:00.0"]


def _fake_pynvml(*, init_error=None, nvlinks=(18, 0), fail_pcie=False, nvlink_version=6,
                 bad_handles=None, field_errors=None, arch=None, link_errors=None):
    """A pynvml stand-in with len(nvlinks) GPUs (at most 3).

    bad_handles: {index: exception} raised by nvmlDeviceGetHandleByIndex;
    field_errors: {"nvmlDeviceGet...": exception} raised by that query for every GPU;
    arch: nvmlDeviceGetArchitecture's answer for every GPU (None: an old pynvml without it);
    link_errors: {link: exception} raised by nvmlDeviceGetNvLinkState on that link.
    """
    bad_handles = bad_handles or {}
    field_errors = field_errors or {}
    link_errors = link_errors or {}
    fake = types.ModuleType("pynvml")
    fake.NVML_FEATURE_ENABLED = 1
    fake.NVMLError = _FakeNVMLError
    state = {"shutdown": 0}
    fake.state = state

    def nvmlInit():
        if init_error is not None:
            raise init_error

    def nvmlShutdown():
        state["shutdown"] += 1

    def handle_by_index(index):
        if index in bad_handles:
            raise bad_handles[index]
        return index

    def link_state(handle, link):
        if nvlinks[handle] == 0:
            raise _FakeNVMLError("Not Supported")
        if link >= 18:
            raise _FakeNVMLError("Invalid Argument")
        if link in link_errors:
            raise link_errors[link]
        return 1 if link < nvlinks[handle] else 0

    def pcie(value):
        def getter(handle):
            if fail_pcie:
                raise _FakeNVMLError("Not Supported")
            return value

        return getter

    fake.nvmlInit = nvmlInit
    fake.nvmlShutdown = nvmlShutdown
    fake.nvmlDeviceGetCount = lambda: len(nvlinks)
    fake.nvmlDeviceGetHandleByIndex = handle_by_index
    # Old bindings return bytes, new ones str: exercise both.
    fake.nvmlDeviceGetName = lambda h: _FAKE_NAMES[h]
    fake.nvmlDeviceGetUUID = lambda h: f"GPU-0000000{h}-aaaa-bbbb-cccc-dddddddddddd"
    fake.nvmlDeviceGetPciInfo = lambda h: types.SimpleNamespace(busId=_FAKE_BUS_IDS[h])
    fake.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(
        total=_FAKE_MEMORY[h], free=0, used=0
    )
    fake.nvmlDeviceGetCurrPcieLinkGeneration = pcie(4)
    fake.nvmlDeviceGetMaxPcieLinkGeneration = pcie(5)
    fake.nvmlDeviceGetCurrPcieLinkWidth = pcie(16)
    fake.nvmlDeviceGetMaxPcieLinkWidth = pcie(16)
    fake.nvmlDeviceGetNvLinkState = link_state
    fake.nvmlDeviceGetNvLinkVersion = lambda handle, link: nvlink_version
    if arch is not None:
        fake.nvmlDeviceGetArchitecture = lambda h: arch
    fake.nvmlSystemGetDriverVersion = lambda: b"550.54.15"
    fake.nvmlSystemGetCudaDriverVersion = lambda: 12040
    for query, exc in field_errors.items():
        setattr(fake, query, _raiser(exc))
    return fake


def _raiser(exc):
    def query(*args):
        raise exc

    return query


def _no_nvidia_smi(monkeypatch):
    monkeypatch.setattr(topo_probe.shutil, "which", lambda name: None)

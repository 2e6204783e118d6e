"""The real prometheus-node-exporter (Debian's package), started on 127.0.0.1 with only its
textfile collector, for the tests that read `watch`'s textfile the way Prometheus does: over
HTTP, through the exporter's own parser. `make node-exporter` unpacks it into .cache/ where apt
can fetch it; elsewhere `binary()` says why there is none and the tests skip."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from helpers import debian_tool, free_port, processes
from paths import REPO

NAME = "prometheus-node-exporter"
UNPACKED = REPO / ".cache" / "node-exporter" / "usr" / "bin" / NAME
START_S = 15  # from start to a /metrics that answers; it takes about 0.1 s here


def binary() -> tuple[Path | None, str]:
    """The exporter, or None and why there is none."""
    return debian_tool(NAME, UNPACKED, "node-exporter")


@dataclass
class Exporter:
    url: str  # .../metrics
    proc: subprocess.Popen

    def scrape(self, timeout: float = 5) -> str:
        with urllib.request.urlopen(self.url, timeout=timeout) as r:
            return r.read().decode()


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError):
        return False


@contextlib.contextmanager
def node_exporter(textfile_dir: Path) -> Iterator[Exporter]:
    """The exporter serving `textfile_dir`'s *.prom files on a free 127.0.0.1 port, within
    the suite's process budget (one slot; the test is marked procs(n) or multiproc), and
    killed with its process group when the block ends, however it ends."""
    exe, why = binary()
    assert exe is not None, why
    with processes(1):
        for _ in range(3):  # the free port may be taken before the exporter binds it
            port = free_port()
            url = f"http://127.0.0.1:{port}/metrics"
            proc = subprocess.Popen(
                [str(exe), f"--web.listen-address=127.0.0.1:{port}",
                 "--collector.disable-defaults", "--collector.textfile",
                 f"--collector.textfile.directory={textfile_dir}",
                 "--web.disable-exporter-metrics"],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                start_new_session=True)
            try:
                deadline = time.monotonic() + START_S
                while proc.poll() is None and not _answers(url):
                    assert time.monotonic() < deadline, f"{NAME} did not answer in {START_S} s"
                    time.sleep(0.05)
                if proc.poll() is None:
                    yield Exporter(url, proc)
                    return
                said = proc.stderr.read()
                if "address already in use" not in said:
                    raise AssertionError(f"{NAME} exited {proc.returncode}:\n{said}")
            finally:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                proc.stderr.close()
        raise AssertionError(f"{NAME}: no free port in 3 tries")

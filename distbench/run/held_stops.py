"""Stop signals held for a block: noted, not raised, and the handlers they displaced restored
after it. Two places must not be cut where a handler would raise: a watch's cycles (every rank
must leave at the same collective, or NCCL hangs the others) and the fork of a worker (raised
inside the fork's own hooks, the agent's SignalException is printed as "Exception ignored" and
lost)."""

from __future__ import annotations

import os
import signal
import threading

from distbench.core.exitcodes import STOP_SIGNALS


class HeldStops:
    """`with HeldStops() as held:` the first stop signal of the block is in `held.signum` (0:
    none). Python sets handlers in the main thread alone: elsewhere nothing is held. A child
    forked within the block does not restore the parent's handlers (as_if_exec resets them)."""

    def __init__(self) -> None:
        self.signum = 0
        self._before: dict = {}
        self._pid = os.getpid()

    def __enter__(self) -> HeldStops:
        if threading.current_thread() is threading.main_thread():
            for signum in STOP_SIGNALS:
                self._before[signum] = signal.signal(signum, self._note)
        return self

    def _note(self, signum, frame) -> None:
        self.signum = self.signum or signum

    def __exit__(self, *exc) -> None:
        if os.getpid() == self._pid:
            for signum, handler in self._before.items():
                signal.signal(signum, handler)

    def deliver(self) -> None:
        """After the block: the held signal to the handler it displaced, as if it came now."""
        handler = self._before.get(self.signum)
        if self.signum and callable(handler):
            handler(self.signum, None)

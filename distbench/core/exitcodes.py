"""Exit codes: one meaning in every command, and the only place they are defined."""

from __future__ import annotations

import signal

EXIT_OK = 0
EXIT_WRONG = 1  # a result differs from its independently computed value or reference
EXIT_BAD_INPUT = 2  # refused before any measurement
EXIT_FAILED = 3  # a runtime failure: a dead or stalled rank, an error the run could not survive
EXIT_BELOW = 4  # measured fine but below expectation (slow links)
# Nothing, or too little, was measured to judge: an acceptance whose checks (or every check of a
# scope) were skipped. Not a pass: a verdict on nothing measured must not read as one. pytest
# gives 5 to a run that collected no test, for the same reason.
EXIT_INCONCLUSIVE = 5


def for_signal(signum: int) -> int:
    """What a shell reports for a process ended by that signal."""
    return 128 + signum


EXIT_INTERRUPTED = for_signal(signal.SIGINT)
EXIT_TERMINATED = for_signal(signal.SIGTERM)

# Signals that stop a run: SIGINT interrupts it (Ctrl-C); the others terminate it (a scheduler,
# a launcher stopping its workers, a closed terminal, a quit request).
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
TERMINATING_SIGNALS = STOP_SIGNALS[1:]

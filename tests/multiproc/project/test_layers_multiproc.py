"""The light modules load light in a fresh interpreter: what they import, from nothing. The
layers read from the source: test_layers.py."""

from __future__ import annotations

import pytest
from paths import REPO

PACKAGE = REPO / "distbench"


# The static checks above, held against what an interpreter really loads (an import the source
# hides from ast, such as importlib's, is caught here): one fresh interpreter, each module in
# turn, and what it may not have brought in checked before the next is imported.
FRESH = [("distbench.core.sizes", "", ("torch", "numpy")),
         ("distbench.results.alphabeta", "", ("torch",)),
         ("distbench.kinds.accept.profile_files", "m.available(); m.resolve('h100-sxm-8')",
          ("torch",)),
         ("distbench.kinds.accept.itinerary",
          "m.lines(m.make(sys.modules['distbench.kinds.accept.profile_files']"
          ".resolve('h100-sxm-8'), m.Cluster.uniform(4, 8), False))", ("torch",))]


@pytest.mark.multiproc  # a fresh interpreter: what the modules import, from nothing
def test_light_modules_load_light_in_a_fresh_interpreter():
    from helpers import python_c

    code = "import importlib, sys\n" + "".join(
        f"m = importlib.import_module({name!r}); {call}\n"
        f"print({name!r}, [b for b in {banned!r} if b in sys.modules])\n"
        for name, call, banned in FRESH)
    proc = python_c(code, PACKAGE.parent)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [f"{name} []" for name, _, _ in FRESH], proc.stdout

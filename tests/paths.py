"""Where things are, whatever folder a test module sits in (tests/unit/<area>/,
tests/multiproc/<area>/): use these, never a count of parents from a test's own file."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parent  # tests/: the helper modules, golden/, fixtures/
REPO = TESTS.parent  # the checkout: distbench/, configs/, docs/, benchmarks/
FIXTURES = TESTS / "fixtures"

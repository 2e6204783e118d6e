"""`distbench` with the test-only op registered first: what a user's own entry script with
their own ops looks like. Run under torchrun by test_registry.py."""

import throwaway_op  # noqa: F401 - registers the op

from distbench.cli.app import main

main()

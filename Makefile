# Newcomer entry points: `make run` (default gloo sweep on local CPU workers) and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# The CPU build of 2.13.0 sits on the dev/CI machines' disk; a bare `torch` could pull a multi-GB
# CUDA build. On a GPU box, override: make test TORCH_SPEC='torch>=2.10' (pyproject's floor).
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.installed
# Where the environment says not to write bytecode, every process the suite starts compiles
# distbench again, and every pytest process rewrites the test modules' asserts again
# (figures: docs/measurements/test-suite.md).
unexport PYTHONDONTWRITEBYTECODE

.PHONY: venv run test test-fast lint docs node-exporter promtool bench bench-plan bench-megatron bench-published clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check '$(TORCH_SPEC)'
	$(PY) -m pip install -q --disable-pip-version-check -e '.[test]'
	touch $(STAMP)

run: $(STAMP)
	$(VENV)/bin/distbench collective --op all --sizes 1K:16M:x4

lint: $(STAMP)
	$(PY) -m ruff check .

# The options tables of the manual (docs/), regenerated from the command line itself;
# tests/unit/project/test_docs_options.py fails when one is stale.
docs: $(STAMP)
	$(PY) -m distbench.cli.manual

# Three pytest processes (pytest-xdist), each given whole test modules (loadfile: a module's
# fixtures run once): most multi-process tests wait (timeouts, stalls, killed launchers, slots)
# more than they compute, and the others run meanwhile. Since the suite's runs are forked from
# a server that loaded torch once (tests/forkserver.py), three were as fast as two or faster,
# and four waited longer for process slots (docs/measurements/test-suite.md).
# However many run at once, the processes the tests start stay within 8 (tests/helpers.py),
# and a test marked `alone` runs with nothing beside it. --durations=15: CI's output says which
# tests cost the time. pytest exits 5 when it collected nothing: that is a broken suite, not a
# pass.
PYTEST_JOBS ?= 3
FAST_JOBS ?= 2
PYTEST := $(PY) -m pytest -q --dist loadfile

test: $(STAMP) lint
	$(PYTEST) -n $(PYTEST_JOBS) --durations=15; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: pytest ran no test" >&2; exit 1; fi; exit $$rc

# The unit tests alone, tests/unit/: no test that starts a process. Those are marked multiproc
# and live in tests/multiproc/; tests/conftest.py fails a test in the wrong folder, so no
# `-m "not multiproc"` here, which would pass over a misplaced one in silence. The unit tests
# that wait on real clocks (marked clock: a timeout, a grace, a watchdog's budget) run in a
# pytest process of their own beside the FAST_JOBS that compute, its report printed after
# theirs: among them, asleep, they left a core idle for about 14 s of 78
# (docs/measurements/test-suite.md).
test-fast: $(STAMP)
	@clock_log=$$(mktemp); \
	$(PY) -m pytest -q -p no:xdist -m clock tests/unit > $$clock_log 2>&1 & clock=$$!; \
	$(PYTEST) -n $(FAST_JOBS) -m "not clock" tests/unit; rc=$$?; \
	wait $$clock; clock_rc=$$?; \
	echo "-- the unit tests that wait on real clocks (-m clock), run beside those:"; \
	cat $$clock_log; rm -f $$clock_log; \
	if [ $$rc -eq 5 ] || [ $$clock_rc -eq 5 ]; then \
		echo "make test-fast: pytest ran no test" >&2; exit 1; fi; \
	if [ $$rc -ne 0 ]; then exit $$rc; fi; exit $$clock_rc

# Debian's prometheus-node-exporter for the test that scrapes `watch`'s textfile through it
# (tests/exporter.py), unpacked into .cache/, not installed: `apt-get install` would start it
# as a system service. Where it is already on PATH, or there is no apt, nothing is done (the
# test then skips and says why).
NODE_EXPORTER := .cache/node-exporter/usr/bin/prometheus-node-exporter

node-exporter:
	@if command -v prometheus-node-exporter >/dev/null || test -x $(NODE_EXPORTER); then exit 0; fi; \
	if ! command -v apt-get >/dev/null || ! command -v dpkg-deb >/dev/null; then \
		echo "make node-exporter: no apt-get/dpkg-deb here" >&2; exit 1; fi; \
	tmp=$$(mktemp -d) && chmod 755 "$$tmp" && trap 'rm -rf "$$tmp"' EXIT && \
	(cd "$$tmp" && apt-get download -q prometheus-node-exporter) && \
	mkdir -p .cache/node-exporter && \
	dpkg-deb -x "$$tmp"/prometheus-node-exporter_*.deb .cache/node-exporter && \
	$(NODE_EXPORTER) --version 2>&1 | head -1

# promtool, for the test that checks and unit-tests configs/prometheus/distbench-rules.yml
# (tests/multiproc/kinds/watch/test_watch_rules_multiproc.py): Debian's prometheus package
# brings it, unpacked as node-exporter is above, since `apt-get install prometheus` would
# start the Prometheus server as a service.
PROMTOOL := .cache/prometheus/usr/bin/promtool

promtool:
	@if command -v promtool >/dev/null || test -x $(PROMTOOL); then exit 0; fi; \
	if ! command -v apt-get >/dev/null || ! command -v dpkg-deb >/dev/null; then \
		echo "make promtool: no apt-get/dpkg-deb here" >&2; exit 1; fi; \
	tmp=$$(mktemp -d) && chmod 755 "$$tmp" && trap 'rm -rf "$$tmp"' EXIT && \
	(cd "$$tmp" && { apt-get download -q prometheus || \
		{ apt-get update -q && apt-get download -q prometheus; }; }) && \
	mkdir -p .cache/prometheus && \
	dpkg-deb -x "$$tmp"/prometheus_*.deb .cache/prometheus && \
	$(PROMTOOL) --version 2>&1 | head -1

bench: $(STAMP)
	$(PY) benchmarks/overhead.py
	$(PY) benchmarks/report_speed.py
	$(PY) benchmarks/false_alarms.py
	$(PY) benchmarks/worker_footprint.py

# The planner's error on this machine: plan --workers 4 --validate 6, 3 times (about 12 minutes;
# the figures: docs/measurements/bench-plan.md)
bench-plan: $(STAMP)
	$(PY) benchmarks/plan_accuracy.py

# Megatron-LM's published runs (SC'21) through plan's command line from --fabric dgx-a100 alone:
# 15 plans, two at a time, nothing measured (the figures: docs/measurements/bench-megatron.md)
bench-megatron: $(STAMP)
	$(PY) benchmarks/megatron_sc21.py

# torchtitan's published runs through `distbench plan`'s command line, one compute scale per GPU
# kind (benchmarks/published/torchtitan.csv), 2 at a time (docs/measurements/bench-published.md)
bench-published: $(STAMP)
	$(PY) benchmarks/published_runs.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .cache

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

# `beside` runs a pytest ($(1), whose output comes after) in the background while another runs
# ($(2)); either failing fails the target, and so does either collecting nothing (pytest's exit
# 5: a broken suite, not a pass).
define beside
	@log=$$(mktemp); trap 'kill $$other 2>/dev/null; rm -f $$log' EXIT; \
	$(1) > $$log 2>&1 & other=$$!; \
	$(2); rc=$$?; \
	wait $$other; other_rc=$$?; other=; \
	echo "-- $(3), run beside those:"; cat $$log; \
	if [ $$rc -eq 5 ] || [ $$other_rc -eq 5 ]; then echo "make $@: pytest ran no test" >&2; exit 1; fi; \
	if [ $$rc -ne 0 ]; then exit $$rc; fi; exit $$other_rc
endef

# The multi-process tests (and the unit tests that wait on real clocks, marked clock) in three
# pytest processes (pytest-xdist), each given whole test modules (loadfile: a module's fixtures
# run once): they wait (timeouts, stalls, killed launchers, process slots) more than they
# compute. However many run at once, the processes the tests start stay within 8
# (tests/helpers.py), and a test marked `alone` runs with nothing beside it, in any of the
# four pytest processes (helpers.running_test). The unit tests that compute run beside them in
# one pytest process at the lowest priority (nice 19), on the CPU those leave idle: in the three
# processes, they held one of them while its turn for slots went by
# (docs/measurements/test-suite.md). --durations=15: CI's output says which tests cost the time.
PYTEST_JOBS ?= 3
FAST_JOBS ?= 2
PYTEST := $(PY) -m pytest -q --dist loadfile
PYTEST_ONE := $(PY) -m pytest -q -p no:xdist
COMPUTE := -m "not multiproc and not clock"

test: $(STAMP) lint
	$(call beside,nice -n 19 $(PYTEST_ONE) $(COMPUTE),$(PYTEST) -n $(PYTEST_JOBS) -m "multiproc or clock" --durations=15,the unit tests that compute (not multiproc and not clock; nice 19))

# The unit tests alone, tests/unit/: no test that starts a process. Those are marked multiproc
# and live in tests/multiproc/; tests/conftest.py fails a test in the wrong folder, so no
# `-m "not multiproc"` here, which would pass over a misplaced one in silence. The unit tests
# that wait on real clocks (marked clock: a timeout, a grace, a watchdog's budget) run in a
# pytest process of their own beside the FAST_JOBS that compute: among them, asleep, they left
# a core idle for about 14 s of 78 (docs/measurements/test-suite.md).
test-fast: $(STAMP)
	$(call beside,$(PYTEST_ONE) -m clock tests/unit,$(PYTEST) -n $(FAST_JOBS) -m "not clock" tests/unit,the unit tests that wait on real clocks (-m clock))

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

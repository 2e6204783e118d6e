# Newcomer entry points: `make run` (default gloo sweep on local CPU workers) and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# The CPU build of 2.13.0 sits on the dev/CI machines' disk; a bare `torch` could pull a multi-GB
# CUDA build. On a GPU box, override: make test TORCH_SPEC='torch>=2.10' (pyproject's floor).
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.installed

.PHONY: venv run test lint bench clean

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

# pytest exits 5 when it collected nothing: that is a broken suite, not a pass.
test: $(STAMP) lint
	$(PY) -m pytest -q; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: pytest ran no test" >&2; exit 1; fi; exit $$rc

bench: $(STAMP)
	$(PY) benchmarks/overhead.py
	$(PY) benchmarks/report_speed.py
	$(PY) benchmarks/false_alarms.py
	$(PY) benchmarks/worker_footprint.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache

# The two commands (README): `make pipeline` runs the whole DAG on the embedded default; `make test` runs the
# tests. Both set up what they need first (scripts/setup.sh is idempotent and fast the second time).
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: setup pipeline demo test test-fast bench
setup:
	bash scripts/setup.sh

pipeline: setup
	bash scripts/run-pipeline.sh

demo: setup
	$(VENV)/bin/ringflow demo

test: setup
	$(PY) -m pytest

test-fast: setup
	$(PY) -m pytest -m "not slow"

bench: setup
	$(PY) bench/throughput.py
	$(PY) bench/health_overhead.py
	$(PY) bench/shard_throughput.py
	$(PY) bench/promotion.py
	$(PY) bench/orchestration_overhead.py
	$(PY) bench/data_scaling.py
	$(PY) bench/watcher_cost.py

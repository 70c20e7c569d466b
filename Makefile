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

# The browser test's screenshots (tests/dags/ui) are kept in test-output/ui, one per step.
test: setup
	RINGFLOW_UI_SCREENSHOTS=$(CURDIR)/test-output/ui PY=$(PY) scripts/test.sh

test-fast: setup
	$(PY) -m pytest -m "not slow"

bench: setup
	$(PY) bench/throughput.py
	$(PY) bench/health_overhead.py
	$(PY) bench/health_overhead.py --engine ddp --out health_overhead-ddp
	$(PY) bench/checkpoint_overhead.py
	$(PY) bench/checkpoint_profile.py
	$(PY) bench/bind_cores.py
	$(PY) bench/shard_throughput.py
	$(PY) bench/promotion.py
	$(PY) bench/orchestration_overhead.py
	$(PY) bench/data_scaling.py
	$(PY) bench/watcher_cost.py
	$(PY) bench/data_memory.py  # last: it needs root (memory cgroups)

# The GPU path in minutes where a GPU exists (one short job per engine; bench/results/gpu_check.md); without
# one it says so and exits 0.
.PHONY: bench-gpu
bench-gpu: setup
	$(PY) bench/gpu_check.py

# The two commands (README): `make pipeline` runs the whole DAG on the embedded default; `make test` runs the
# tests. Both set up what they need first (scripts/setup.sh is idempotent and fast the second time).
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: setup pipeline demo test test-fast bench docs
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
	$(PY) -m pytest -m pure

# The documentation site (mkdocs.yml, docs/) into site/: strict, so a broken link or anchor, a page left out of the
# navigation or a missing snippet fails the build. The reference pages are generated from the code as it builds.
docs: setup
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

bench: setup
	$(PY) -m bench.throughput
	$(PY) -m bench.throughput --skip-table --steps 5000 --jobs 1 --out throughput_in_job  # long enough for the 30 s checkpoint floor
	$(PY) -m bench.health_overhead
	$(PY) -m bench.health_overhead --engine ddp --out health_overhead-ddp
	$(PY) -m bench.local_sgd --repeats 3 --epochs 2
	$(PY) -m bench.checkpoint_overhead
	$(PY) -m bench.checkpoint_profile
	$(PY) -m bench.bind_cores
	$(PY) -m bench.shard_throughput
	$(PY) -m bench.sharding_order --rows 400000 --repeats 8 --feeds stream memory --out sharding_order-split  # against the last revision with per-rank partitions
	$(PY) -m bench.promotion
	$(PY) -m bench.orchestration_overhead
	$(PY) -m bench.data_scaling
	$(PY) -m bench.watcher_cost
	$(PY) -m bench.engines_crosscheck --repeats 3  # needs the TF venv (scripts/setup.sh makes it)
	$(PY) -m bench.tf_vs_plain --repeats 5 --epochs 30  # needs the TF venv too
	$(PY) -m bench.user_script_bench --repeats 3
	$(PY) -m bench.elastic_recovery --repeats 3
	$(PY) -m bench.elastic_recovery --repeats 3 --commits-only --out elastic_commits
	$(PY) -m bench.elastic_recovery --real-size --out elastic_recovery_real_size
	$(PY) -m bench.elastic_recovery --real-size --engine ddp --out elastic_recovery_real_size-ddp
	$(PY) -m bench.ddp_restart_recovery --repeats 3
	$(PY) -m bench.data_memory  # last: it needs root (memory cgroups)

# The GPU path in minutes where a GPU exists (one short job per engine; bench/results/gpu_check.md); without
# one it says so and exits 0.
.PHONY: bench-gpu
bench-gpu: setup
	$(PY) -m bench.gpu_check

"""Formats every layer reads and writes: the job config, the shard manifest, checkpoints, the run folder and
its result, exit codes, the engine table, eval results.

May import: the standard library, numpy/pyarrow, ringflow.training.store and ringflow.training.health.
Never: torch, Airflow, ringflow.training.rank, ringflow.training.core, ringflow.operators.
"""

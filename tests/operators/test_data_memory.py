"""The shard and validate tasks' work inside a 512 MiB memory cgroup, on a table that did not fit before.

The table: 1 M rows x 64 float32 features and a target (264 MB of raw values) in 2 row groups of 132 MB
decoded. Before the readers streamed slices of row groups and wide tables in column groups, both steps were
OOM-killed here (their anonymous memory at the limit; a 1 GiB cgroup was enough). The kernel enforces the limit,
so passing is the proof; how much below the limit they stay, and how fast, is bench/data_memory.py's job.
"""
from __future__ import annotations

import json
import os
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from memory_cgroup import CgroupUnavailable, memory_cgroup  # tests/ is on sys.path (its conftest.py)

pytestmark = pytest.mark.job

LIMIT = 512 * 2**20
ROWS, FEATURES, ROW_GROUPS = 1_000_000, 64, 2


@pytest.fixture(scope="module")
def big_row_groups(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("data-memory") / "table.parquet"
    rng = np.random.default_rng(0)
    per_group = ROWS // ROW_GROUPS
    schema = pa.schema([*[(f"f{i}", pa.float32()) for i in range(FEATURES)], ("target", pa.int64())])
    with pq.ParquetWriter(path, schema) as writer:
        for _ in range(ROW_GROUPS):
            columns = [pa.array(rng.standard_normal(per_group, dtype=np.float32)) for _ in range(FEATURES)]
            writer.write_table(pa.table([*columns, pa.array(rng.integers(0, 10, per_group))], schema=schema),
                               row_group_size=per_group)
    return str(path)


def _run_limited(code: str) -> dict:
    """`code` in a fresh Python inside a LIMIT memory cgroup; what it printed last, as JSON."""
    try:
        with memory_cgroup(LIMIT, "test-data") as group:
            measured = group.run([sys.executable, "-c", code], env=os.environ, timeout=600)
    except CgroupUnavailable as exc:
        pytest.skip(f"needs a memory cgroup of its own: {exc}")
    assert measured.passed, (measured.summary(), measured.stderr[-3000:])
    return json.loads(measured.stdout.strip().splitlines()[-1])


def test_the_shard_task_shards_it_inside_512_mib(big_row_groups, tmp_path):
    result = _run_limited(
        "import json\nfrom ringflow.operators.shard import shard_dataset\n"
        f"print(json.dumps(shard_dataset({big_row_groups!r}, {str(tmp_path / 'shards')!r}, num_partitions=2, "
        "batch_size=64)))")
    assert result["partitions"] * result["rows_per_partition"] + result["eval_rows"] == ROWS


def test_the_validate_task_validates_it_inside_512_mib(big_row_groups):
    suite = [
        {"type": "expect_column_values_to_be_between", "kwargs": {"column": "f0", "min_value": -20, "max_value": 20}},
        {"type": "expect_column_mean_to_be_between", "kwargs": {"column": "f63", "min_value": -0.1, "max_value": 0.1}},
        {"type": "expect_table_row_count_to_equal", "kwargs": {"value": ROWS}}]
    result = _run_limited(
        "import json\nfrom ringflow.operators.validate import ValidateDatasetOperator\n"
        f"print(json.dumps(ValidateDatasetOperator(task_id='validate', dataset_uri={big_row_groups!r}, "
        f"suite={suite!r}).execute({{}})))")
    assert (result["rows"], result["columns"], result["sampled"]) == (ROWS, FEATURES + 1,
                                                                      ["expect_column_mean_to_be_between"])

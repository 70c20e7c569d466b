"""What each expectation is checked on when the data streams, and which columns it reads.

- every row (exact): GX's column map expectations (`expect_column_values_to_*`) and ringflow's tensor ones;
- schema and row count (exact): table expectations about columns run on the schema (a table of no rows);
  `expect_table_row_count_*` run on the exact row count;
- sample: everything else (aggregates, and map expectations that compare rows with each other).
Great Expectations is imported only inside expectation_scope: DAG files must parse without it.
"""
from __future__ import annotations

from typing import Any, Mapping

EVERY_ROW, SCHEMA, ROW_COUNT, SAMPLE = "every row", "schema", "row count", "sample"
ROW_COUNT_EXPECTATIONS = ("expect_table_row_count_to_be_between", "expect_table_row_count_to_equal")
TENSOR_SHAPE, TENSOR_RANGE = "expect_column_values_to_be_tensors", "expect_column_tensor_values_to_be_between"
RINGFLOW_EXPECTATIONS = (TENSOR_SHAPE, TENSOR_RANGE)
# Map expectations that compare rows with other rows: per batch they would miss what spans batches.
NOT_ROW_LOCAL = ("expect_column_values_to_be_unique", "expect_compound_columns_to_be_unique",
                 "expect_multicolumn_values_to_be_unique", "expect_column_values_to_be_increasing",
                 "expect_column_values_to_be_decreasing")
TENSOR_SHAPE, TENSOR_RANGE = "expect_column_values_to_be_tensors", "expect_column_tensor_values_to_be_between"
RINGFLOW_EXPECTATIONS = (TENSOR_SHAPE, TENSOR_RANGE)


def expectation_scope(expectation_type: str) -> str:
    """What an expectation is checked on when the data streams: EVERY_ROW, SCHEMA, ROW_COUNT or SAMPLE."""
    if expectation_type in RINGFLOW_EXPECTATIONS:
        return SCHEMA if expectation_type == TENSOR_SHAPE else EVERY_ROW
    if expectation_type in ROW_COUNT_EXPECTATIONS:
        return ROW_COUNT
    if expectation_type in NOT_ROW_LOCAL:
        return SAMPLE
    from great_expectations.expectations.expectation import (
        BatchExpectation, ColumnMapExpectation, ColumnPairMapExpectation, MulticolumnMapExpectation)
    from great_expectations.expectations.registry import get_expectation_impl

    impl = get_expectation_impl(expectation_type)
    if issubclass(impl, (ColumnMapExpectation, ColumnPairMapExpectation, MulticolumnMapExpectation)):
        return EVERY_ROW
    if issubclass(impl, BatchExpectation) and (expectation_type == "expect_column_to_exist"
                                               or expectation_type.startswith("expect_table_column")):
        return SCHEMA
    return SAMPLE


def row_count_passes(expectation_type: str, kwargs: Mapping[str, Any], rows: int) -> bool:
    """GX's row-count expectations, on the exact count (their kwargs as GX documents them)."""
    if expectation_type == "expect_table_row_count_to_equal":
        return rows == kwargs["value"]
    low, high = kwargs.get("min_value"), kwargs.get("max_value")
    if low is not None and (rows <= low if kwargs.get("strict_min") else rows < low):
        return False
    return high is None or (rows < high if kwargs.get("strict_max") else rows <= high)



def expectation_columns(expectation: Mapping[str, Any]) -> tuple[str, ...] | None:
    """The columns an expectation reads (`column`, `column_A`, `column_B`, `column_list`), or None when it may
    read any: a table-level one takes the whole table, and a `row_condition` names columns in its own syntax."""
    kwargs = expectation["kwargs"]
    if kwargs.get("row_condition"):
        return None
    named = [kwargs[k] for k in ("column", "column_A", "column_B") if k in kwargs]
    named += list(kwargs.get("column_list") or ())
    return tuple(named) or None

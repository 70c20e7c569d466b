"""Validate a dataset a batch at a time: memory grows neither with the rows nor with the columns.

The dataset is read one record batch at a time (datasets.BATCH_BYTES), only the columns something checks, a
wide Parquet table one column group per pass (datasets.Dataset.column_groups), each expectation given only the
columns it names (bench/data_memory.py: inside 512 MiB). Each expectation has a scope (scopes.py), reported
with every failure: every row and the row count are exact; aggregates and the expectations that compare rows
with each other run on a uniform sample of at most SAMPLE_ROWS rows (and SAMPLE_BYTES), the same rows for the
same data. With a target, the input gate (every feature and the target finite) streams along.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from .gx_run import RESULT_FORMAT, gx_context
from .outcome import Outcome, add_gx_results, failures_of, outcome_key
from .scopes import (
    EVERY_ROW, RINGFLOW_EXPECTATIONS, ROW_COUNT, SAMPLE, SCHEMA, expectation_columns, expectation_scope,
    row_count_passes)
from .suite import build_suite
from .summary import ValidationSummary
from .tensors import tensor_outcome

# The sample aggregate expectations run on: at most this many rows, and this many bytes of them.
SAMPLE_ROWS = 100_000
SAMPLE_BYTES = 64 * 2**20
_SAMPLE_SEED = 0


def empty_table(schema: Any) -> Any:
    """A table of `schema` with no rows (Schema.empty_table cannot make a fixed_shape_tensor column)."""
    import pyarrow as pa

    arrays = [pa.ExtensionArray.from_storage(f.type, pa.array([], f.type.storage_type))
              if isinstance(f.type, pa.BaseExtensionType) else pa.array([], f.type) for f in schema]
    return pa.table(arrays, schema=schema)


def validate_dataset(dataset: Any, suite: Mapping[str, Any], target: str | None = None,
                     features: Sequence[str] | None = None, batch_rows: int | None = None) -> ValidationSummary:
    """Run `suite` (load_suite's form) over a datasets.Dataset, a batch at a time (see the module docstring
    for which expectations see every row). With `target`, the input gate streams along.

    Only the columns something checks are read, one column group per pass (datasets.Dataset.column_groups:
    a wide Parquet table in several), and each expectation is given only the columns it names."""
    import great_expectations as gx
    import pyarrow as pa

    from ...formats.datasets import as_dataset
    from ...formats.tensor_columns import row_bytes
    from ..input_gate import InputGate, feature_columns
    from ..sharding import shuffled_positions

    dataset = as_dataset(dataset)
    exps = suite["expectations"]
    build_suite(gx, suite)  # every expectation is checked (and a bad one named) before any data is read
    scope_of = {e["type"]: expectation_scope(e["type"]) for e in exps}
    by_scope = {scope: [e for e in exps if scope_of[e["type"]] == scope] for scope in (EVERY_ROW, SCHEMA, ROW_COUNT, SAMPLE)}
    context, batch_definition = gx_context()

    def gx_suite(name: str, entries: list) -> Any:
        gx_entries = [e for e in entries if e["type"] not in RINGFLOW_EXPECTATIONS]
        return context.suites.add(build_suite(gx, {"name": f"{suite['name']}/{name}", "expectations": gx_entries})) \
            if gx_entries else None

    outcomes: dict[str, Outcome] = {}
    for e in exps:  # in suite order, so a report lists them as written
        outcomes.setdefault(outcome_key(e["type"], e["kwargs"]), Outcome(e["type"], dict(e["kwargs"])))

    def run(gx_suite_: Any, frame: pd.DataFrame) -> None:
        if gx_suite_ is not None:
            add_gx_results(outcomes, batch_definition.get_batch(batch_parameters={"dataframe": frame})
                            .validate(gx_suite_, result_format=RESULT_FORMAT))

    columns, rows = dataset.columns, dataset.num_rows
    everything = tuple(columns)

    def reads(e: Mapping[str, Any]) -> tuple[str, ...]:
        return expectation_columns(e) or everything

    # An expectation naming a column the dataset lacks cannot pass: it runs once, on the schema, for its error;
    # so does every GX one when there are no rows (GX still checks the columns).
    streamed = [e for e in by_scope[EVERY_ROW] if all(c in columns for c in reads(e))]
    on_schema = by_scope[SCHEMA] + [e for e in by_scope[EVERY_ROW] if e not in streamed
                                    or (not rows and e["type"] not in RINGFLOW_EXPECTATIONS)]
    sample_suite = gx_suite("sample", by_scope[SAMPLE])
    sample_size = min(SAMPLE_ROWS, max(1, SAMPLE_BYTES // row_bytes(dataset.schema))) if sample_suite else 0
    sampled = {c for e in by_scope[SAMPLE] for c in reads(e)} if sample_size else set()
    gated = set(feature_columns(columns, target, features)) | {target} if target is not None else set()
    read = [c for c in columns if c in gated or c in sampled or any(c in reads(e) for e in streamed)]
    groups = dataset.column_groups(read, together=[reads(e) for e in streamed
                                                   if e["type"] not in RINGFLOW_EXPECTATIONS])

    empty = empty_table(dataset.schema)
    run(gx_suite("schema", [e for e in on_schema if e["type"] not in RINGFLOW_EXPECTATIONS]), empty.to_pandas())
    for e in on_schema:
        if e["type"] in RINGFLOW_EXPECTATIONS:
            tensor_outcome(outcomes[outcome_key(e["type"], e["kwargs"])], empty, 0)
    gate = InputGate(columns, target, features) if target is not None else None
    sample_parts: list[pa.Table] = []
    for g, names in enumerate(groups if rows else []):
        mine = [e for e in streamed if reads(e)[0] in names]  # `together` put all of an expectation's columns here
        stream_suite = gx_suite(f"stream-{g}", mine)
        gx_columns = [c for c in names if any(c in reads(e) for e in mine if e["type"] not in RINGFLOW_EXPECTATIONS)]
        tensors = [e for e in mine if e["type"] in RINGFLOW_EXPECTATIONS]
        sample_columns = [c for c in names if c in sampled]
        kept: list[pa.RecordBatch] = []
        offset = 0
        for batch in dataset.batches(names, batch_rows=batch_rows):
            if stream_suite is not None:
                frame = batch.select(gx_columns).to_pandas()
                frame.index = pd.RangeIndex(offset, offset + batch.num_rows)  # examples name rows of the whole table
                run(stream_suite, frame)
            for e in tensors:
                tensor_outcome(outcomes[outcome_key(e["type"], e["kwargs"])], batch, offset)
            if gate is not None:
                gate.add(batch)
            if sample_columns:  # the rows whose place in the seeded permutation is among the first sample_size
                keep = shuffled_positions(np.arange(offset, offset + batch.num_rows), rows, _SAMPLE_SEED) < sample_size
                kept.append(batch.select(sample_columns).filter(keep))
            offset += batch.num_rows
        if sample_columns:
            schema = pa.schema([dataset.schema.field(c) for c in sample_columns])
            sample_parts.append(pa.Table.from_batches(kept, schema=schema))
    # The row count is exact, and judged here: GX would build per-row structures even for an empty frame.
    for e in by_scope[ROW_COUNT]:
        outcomes[outcome_key(e["type"], e["kwargs"])].add(row_count_passes(e["type"], e["kwargs"], rows),
                                                   {"observed_value": rows}, None)
    if sample_suite is not None:  # every group kept the same rows, in order: their columns side by side
        parts = {name: part.column(name) for part in sample_parts for name in part.column_names}
        fields = [dataset.schema.field(c) for c in columns if c in parts]
        table = pa.table([parts[f.name] for f in fields], schema=pa.schema(fields)) if parts else empty
        run(sample_suite, table.to_pandas())
    untrainable = tuple(gate.problems()) if gate is not None else ()
    sample_rows = min(sample_size, rows)
    return ValidationSummary(suite=suite["name"], rows=rows, columns=len(dataset.columns), evaluated=len(exps),
                             failures=failures_of(outcomes, scope_of, sample_rows), untrainable=untrainable,
                             scopes={scope: tuple(e["type"] for e in entries) for scope, entries in by_scope.items()},
                             sample_rows=sample_rows)

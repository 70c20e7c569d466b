"""ringflow's expectations for tensor-valued columns (GX has none), judged on Arrow record batches:
`expect_column_values_to_be_tensors` (`column`, `shape`, optional `dtype`: every value has that shape) and
`expect_column_tensor_values_to_be_between` (`column`, `min_value`, `max_value`: every element in range)."""
from __future__ import annotations

from typing import Any

import numpy as np

from .outcome import MAX_EXAMPLES, Outcome
from .scopes import TENSOR_SHAPE


def tensor_outcome(outcome: Outcome, batch: Any, offset: int) -> None:
    """ringflow's tensor expectations on one Arrow record batch."""
    from ...formats.tensor_columns import column_shape, tensor_matrix

    kwargs, column = outcome.kwargs, outcome.kwargs["column"]
    if column not in batch.schema.names:
        outcome.add(False, {}, f"column {column!r} is not in the dataset; columns are {batch.schema.names}")
        return
    shape, element = column_shape(batch.schema.field(column).type)
    if outcome.expectation == TENSOR_SHAPE:
        try:
            dtype = np.dtype(element.to_pandas_dtype()).name  # numpy's names, as in the manifest: float32
        except (NotImplementedError, TypeError):
            dtype = str(element)
        want_dtype = kwargs.get("dtype")
        ok = list(shape) == list(kwargs["shape"]) and (want_dtype is None or dtype == want_dtype)
        outcome.add(ok, {"observed_value": {"shape": list(shape), "dtype": dtype}}, None)
        return
    values, row_null = tensor_matrix(batch.column(column), np.float64)
    low, high = kwargs.get("min_value"), kwargs.get("max_value")
    with np.errstate(invalid="ignore"):
        bad = np.zeros(values.shape, dtype=bool)
        if low is not None:
            bad |= values < low
        if high is not None:
            bad |= values > high
    bad_rows = np.flatnonzero(bad.any(axis=1) & ~row_null)
    first = np.argmax(bad[bad_rows], axis=1) if len(bad_rows) else []
    outcome.add(not len(bad_rows), {
        "unexpected_count": len(bad_rows), "element_count": len(values), "missing_count": int(row_null.sum()),
        "partial_unexpected_list": [values[r, c] for r, c in zip(bad_rows[:MAX_EXAMPLES], first[:MAX_EXAMPLES])],
        "partial_unexpected_index_list": [offset + int(r) for r in bad_rows[:MAX_EXAMPLES]]}, None)

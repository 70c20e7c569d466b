"""Tensor-valued columns: the shape and element type of a column's values, and a column as a (rows, elements)
array. Pure pyarrow and numpy, kept out of datasets.py (which imports pandas), so a training rank reading its
shards imports neither pandas nor the dataset reader."""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import pyarrow as pa

# Assumed width of a value whose type has none (strings, variable lists), to size batches.
_VARIABLE_WIDTH_GUESS = 32


def column_shape(type_: pa.DataType) -> tuple[tuple[int, ...], pa.DataType]:
    """(shape of one value, type of its elements): () for a scalar column, the tensor's shape for Arrow's
    fixed_shape_tensor, the sizes of nested fixed-size lists for those. A variable-length list has no
    shape: (-1,) marks it, and the input gate refuses it."""
    if isinstance(type_, pa.FixedShapeTensorType):
        return tuple(int(s) for s in type_.shape), type_.value_type
    shape: list[int] = []
    while pa.types.is_fixed_size_list(type_) or pa.types.is_list(type_) or pa.types.is_large_list(type_):
        shape.append(type_.list_size if pa.types.is_fixed_size_list(type_) else -1)
        type_ = type_.value_type
    return tuple(shape), type_


def _one_array(column: pa.Array | pa.ChunkedArray) -> pa.Array:
    """A chunked column as one array (its only chunk as it is)."""
    if isinstance(column, pa.ChunkedArray):
        return pa.concat_arrays(column.chunks) if column.num_chunks != 1 else column.chunk(0)
    return column


def tensor_values(column: pa.Array | pa.ChunkedArray) -> pa.Array:
    """The elements of a fixed-shape column, flat in row order (a scalar column as it is)."""
    column = _one_array(column)
    if isinstance(column, pa.ExtensionArray):
        column = column.storage
    while pa.types.is_fixed_size_list(column.type):
        column = column.flatten()
    return column


def tensor_matrix(column: pa.Array | pa.ChunkedArray, dtype=np.float32) -> tuple[np.ndarray, np.ndarray]:
    """A fixed-shape (or scalar) column as a (rows, elements) array of `dtype`, and which rows are null.
    Null elements become NaN; a null row's elements are whatever the buffer holds (check the mask)."""
    column = _one_array(column)
    rows = len(column)
    row_null = np.asarray(column.is_null(), dtype=bool) if column.null_count else np.zeros(rows, dtype=bool)
    if isinstance(column, pa.ExtensionArray):
        column = column.storage
    size = 1
    # Not flatten(): it drops null rows, and the rows must stay aligned.
    while pa.types.is_fixed_size_list(column.type):
        width = column.type.list_size
        column = column.values.slice(column.offset * width, len(column) * width)
        size *= width
    values = column.to_numpy(zero_copy_only=False)
    if values.dtype == object:  # ints with nulls come back as objects holding None
        values = np.asarray([np.nan if v is None else v for v in values], dtype=np.float64)
    return values.astype(dtype, copy=False).reshape(rows, size), row_null


def value_size(shape: Sequence[int]) -> int:
    return math.prod(shape) if shape else 1


def row_bytes(schema: pa.Schema) -> int:
    """Bytes one row takes in memory, about."""
    total = 0
    for field in schema:
        shape, element = column_shape(field.type)
        try:
            width = element.bit_width // 8 or 1
        except ValueError:
            width = _VARIABLE_WIDTH_GUESS
        total += width * value_size([abs(s) for s in shape])
    return max(total, 1)

"""The one dataset reader and the one content fingerprint: streaming batches of bounded size, "same data"
independent of storage and batching, tensor-column shapes."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ringflow.training.formats import datasets
from ringflow.training.formats.datasets import (
    ContentHash, as_dataset, builtin_table, fingerprint, open_dataset, rows_per_batch,
)
from ringflow.training.formats.tensor_columns import column_shape, tensor_matrix
from ringflow.training.store import ObjectNotFound


@pytest.fixture(scope="module")
def wine() -> pa.Table:
    return builtin_table("wine")


def hash_in_batches(table: pa.Table, rows: int) -> str:
    hasher = ContentHash(table.schema)
    for batch in table.to_batches(max_chunksize=rows):
        hasher.update(batch)
    return hasher.hexdigest()


def test_the_fingerprint_does_not_depend_on_batches_or_storage(wine, tmp_path):
    whole = fingerprint(as_dataset(wine))
    assert {hash_in_batches(wine, n) for n in (1, 7, 64, 10_000)} == {whole}
    pq.write_table(wine, tmp_path / "a.parquet", row_group_size=13, compression="snappy")
    pq.write_table(wine, tmp_path / "b.parquet", compression="zstd")
    for name in ("a.parquet", "b.parquet"):
        with open_dataset(str(tmp_path / name)) as dataset:
            assert fingerprint(dataset) == whole


@pytest.mark.parametrize("change", ["value", "name", "order", "type", "null"])
def test_the_fingerprint_changes_with_the_content(wine, change):
    df = wine.to_pandas()
    if change == "value":
        df.loc[100, "alcohol"] += 0.01
    elif change == "name":
        df = df.rename(columns={"alcohol": "alc"})
    elif change == "order":
        df = df.iloc[::-1]
    elif change == "type":
        df["alcohol"] = df["alcohol"].astype("float32")
    elif change == "null":
        df.loc[5, "alcohol"] = np.nan
    assert fingerprint(as_dataset(df)) != fingerprint(as_dataset(wine))


def test_strings_and_tensors_are_fingerprinted_too():
    images = np.arange(2 * 4, dtype=np.float32).reshape(2, 1, 2, 2)
    table = pa.table({"image": pa.FixedShapeTensorArray.from_numpy_ndarray(images), "name": ["a", "b"]})
    other = images.copy()
    other[1, 0, 1, 1] = -1
    changed = table.set_column(0, "image", pa.FixedShapeTensorArray.from_numpy_ndarray(other))
    assert hash_in_batches(table, 1) == hash_in_batches(table, 2) != hash_in_batches(changed, 2)


# (Arrow type) -> (shape, element type)
SHAPES = [
    (pa.float64(), (), pa.float64()),
    (pa.fixed_shape_tensor(pa.float32(), (1, 8, 8)), (1, 8, 8), pa.float32()),
    (pa.list_(pa.list_(pa.int16(), 3), 2), (2, 3), pa.int16()),
    (pa.list_(pa.float32()), (-1,), pa.float32()),
]


@pytest.mark.parametrize("type_, shape, element", SHAPES)
def test_column_shape(type_, shape, element):
    assert column_shape(type_) == (shape, element)


def test_tensor_matrix_keeps_rows_aligned_with_nulls():
    column = pa.array([[1.0, 2.0], None, [3.0, None]], pa.list_(pa.float64(), 2)).slice(1)
    values, null = tensor_matrix(column, np.float64)
    assert values.shape == (2, 2) and list(null) == [True, False]
    assert values[1, 0] == 3.0 and np.isnan(values[1, 1])


def test_batches_are_bounded_by_bytes_not_by_the_table(monkeypatch):
    monkeypatch.setattr(datasets, "BATCH_BYTES", 8 * 1024)
    table = pa.table({f"f{i}": np.zeros(10_000, np.float32) for i in range(8)})  # 32 bytes a row
    assert rows_per_batch(table.schema, 8 * 1024) == 256
    sizes = [b.num_rows for b in as_dataset(table).batches()]
    assert max(sizes) <= 256 and sum(sizes) == 10_000


def test_open_dataset_reads_builtins_local_files_and_names_what_is_missing(tmp_path):
    with open_dataset("builtin:digits_images") as images:
        assert images.num_rows == 1797 and images.columns == ["image", "target"]
        assert column_shape(images.schema.field("image").type)[0] == (1, 8, 8)
    pd.DataFrame({"a": [1.5, 2.5], "target": [0, 1]}).to_csv(tmp_path / "t.csv", index=False)
    with open_dataset(f"file://{tmp_path}/t.csv") as csv:
        assert csv.num_rows == 2 and csv.columns == ["a", "target"]
    with pytest.raises(ObjectNotFound, match="does not exist"):
        with open_dataset(str(tmp_path / "missing.parquet")):
            pass
    with pytest.raises(ValueError, match="use a .parquet or .csv file"):
        with open_dataset(str(tmp_path / "t.json")):
            pass
    with pytest.raises(ValueError, match="unknown built-in"):
        with open_dataset("builtin:nope"):
            pass


def _arrow_memory_while_reading(path, batch_rows: int) -> list[int]:
    in_use = []
    with open_dataset(str(path)) as dataset:
        before = pa.total_allocated_bytes()
        for batch in dataset.batches(batch_rows=batch_rows):
            in_use.append(pa.total_allocated_bytes() - before)
            np.asarray(batch.column(0)).sum()
    return in_use


def _floats(rows: int) -> pa.Table:
    return pa.table({f"f{i}": np.random.default_rng(i).standard_normal(rows, dtype=np.float32) for i in range(8)})


def test_reading_parquet_holds_a_slice_not_the_row_group(tmp_path):
    """Arrow's dataset scanner and pre-buffering read ahead of a slow consumer until the whole file was in
    memory, and reading whole row groups made memory grow with the writer's row-group size; the reader holds
    a slice of rows and each column's current page. Measured as Arrow memory in use while each batch is held:
    one row group of 12.8 MB of floats, in 16,000-row batches (0.5 MB)."""
    pq.write_table(_floats(400_000), tmp_path / "t.parquet", row_group_size=400_000, use_dictionary=False,
                   data_page_size=2**16)
    in_use = _arrow_memory_while_reading(tmp_path / "t.parquet", 16_000)
    assert len(in_use) == 25 and max(in_use) < 4 * 2**20, [round(b / 2**20, 1) for b in in_use]


def test_batches_span_row_groups_and_hold_the_rows_in_order(tmp_path):
    table = _floats(1000)
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=300)
    with open_dataset(str(tmp_path / "t.parquet")) as dataset:
        batches = list(dataset.batches(["f3", "f1"], batch_rows=400))
    assert [b.num_rows for b in batches] == [400, 400, 200] and batches[0].schema.names == ["f3", "f1"]
    assert pa.Table.from_batches(batches).equals(table.select(["f3", "f1"]))


# (columns, read bytes, budget, together) -> groups
GROUPS = [
    (["a", "b", "c", "d"], {"a": 4, "b": 4, "c": 4, "d": 4}, 8, [], [["a", "b"], ["c", "d"]]),
    (["a", "b", "c"], {"a": 4, "b": 4, "c": 4}, 100, [], [["a", "b", "c"]]),
    (["a", "b", "c"], {"a": 20, "b": 4, "c": 4}, 8, [], [["a"], ["b", "c"]]),  # over budget alone: its own group
    (["a", "b", "c", "d"], {"a": 4, "b": 4, "c": 4, "d": 4}, 8, [("a", "d")], [["a", "d"], ["b", "c"]]),
    (["a", "b", "c", "d"], {"a": 4, "b": 4, "c": 4, "d": 4}, 8, [("b", "c"), ("c", "d")], [["a"], ["b", "c", "d"]]),
    (["a", "b"], {"a": 4, "b": 4}, 8, [("a", "missing")], [["a", "b"]]),
]


@pytest.mark.parametrize("columns, read_bytes, budget, together, expected", GROUPS)
def test_column_groups_fit_the_budget_and_keep_sets_together(columns, read_bytes, budget, together, expected):
    assert datasets.column_groups(columns, read_bytes, budget, together) == expected


def test_a_wide_parquet_table_is_read_in_column_groups_that_hold_the_same_data(tmp_path, monkeypatch):
    table = pa.table({**{f"f{i}": np.arange(2000, dtype=np.float32) + i for i in range(6)},
                      "image": pa.FixedShapeTensorArray.from_numpy_ndarray(np.ones((2000, 1, 2, 2), np.float32))})
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=500)
    with open_dataset(str(tmp_path / "t.parquet")) as dataset:
        assert dataset.column_groups() == [dataset.columns]  # narrow: one pass
        monkeypatch.setattr(datasets, "READ_BYTES", 1)  # every column over budget: one pass each
        groups = dataset.column_groups()
        assert groups == [[c] for c in table.column_names]
        assert dataset.column_groups(["f4", "f1", "image"], together=[("f1", "image")]) == [["f4"], ["f1", "image"]]
        hasher = ContentHash(table.schema)
        for group in groups:
            for batch in dataset.batches(group, batch_rows=300):
                hasher.update(batch)
        assert hasher.hexdigest() == fingerprint(as_dataset(table))
    monkeypatch.setattr(datasets, "READ_BYTES", 1)
    assert as_dataset(table).column_groups() == [table.column_names]  # in memory already: one pass


def test_the_fingerprint_refuses_columns_fed_different_rows(wine):
    hasher = ContentHash(wine.schema)
    hasher.update(wine.select(["alcohol"]).to_batches()[0])
    with pytest.raises(ValueError, match="different numbers of rows"):
        hasher.hexdigest()


def test_a_csv_value_of_another_type_past_the_first_block_is_named_with_its_column(tmp_path):
    """Arrow types a CSV's columns from its first block; a later value that does not fit is an error that
    names the column, its type and the value, not Arrow's column number."""
    rows = 60_000  # about 2 MB: the bad value is past the first 1 MB block
    frame = pd.DataFrame({"x": np.linspace(0, 1, rows), "y": np.linspace(1, 2, rows), "target": np.arange(rows) % 3})
    frame = frame.astype({"y": object})
    frame.loc[rows - 2, "y"] = "12,5"
    path = tmp_path / "late-text.csv"
    frame.to_csv(path, index=False)
    with datasets.open_dataset(str(path)) as data:
        assert data.schema.field("y").type == pa.float64()
        with pytest.raises(ValueError, match=r"column 'y' \(double from the first rows\) holds a value of another "
                                             r"type.*invalid value '12,5'; fix that value, or convert"):
            for _ in data.batches():
                pass

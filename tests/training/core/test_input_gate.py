"""The input gate: feature and target columns must hold finite numbers before anything is written. The pure
check on tables, then its two callers on the training side: write_shards and `ringflow shard`."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from ringflow.training.core import cli
from ringflow.training.formats.datasets import BUILTIN, builtin_table, load_builtin
from ringflow.training.core.input_gate import ColumnProblem, UntrainableData, check_trainable, find_problems
from ringflow.training.core.sharding import write_shards
from ringflow.training.store import LocalFolderStore


@pytest.fixture(scope="module")
def digits() -> pd.DataFrame:
    return load_builtin("digits")


def _nan_cells(df, column):
    df.loc[[4, 9, 30], column] = np.nan


def _inf(df, column):
    df[column] = df[column].astype("float64")
    df.loc[[7], column] = np.inf
    df.loc[[8], column] = -np.inf


def _na_string(df, column):
    df[column] = df[column].astype(object)
    df.loc[11, column] = "n/a"


def _text_column(df, column):
    df[column] = ["low" if v < 8 else "high" for v in df[column]]


def _beyond_float32(df, column):
    df[column] = df[column].astype("float64")
    df.loc[3, column] = 1e40


# (damage, column, role, bad rows, kinds, example values, example rows)
CASES = [
    (_nan_cells, "pixel_3_3", "feature", 3, (("null/NaN", 3),), [None, None, None], [4, 9, 30]),
    (_inf, "pixel_3_3", "feature", 2, (("inf", 2),), [float("inf"), float("-inf")], [7, 8]),
    (_na_string, "pixel_3_3", "feature", 1, (("non-numeric", 1),), ["n/a"], [11]),
    (_text_column, "pixel_3_3", "feature", 1797, (("non-numeric", 1797),), None, [0, 1, 2, 3, 4]),
    (_beyond_float32, "pixel_3_3", "feature", 1, (("beyond float32", 1),), [1e40], [3]),
    (_nan_cells, "target", "target", 3, (("null/NaN", 3),), [None, None, None], [4, 9, 30]),
    (_inf, "target", "target", 2, (("inf", 2),), [float("inf"), float("-inf")], [7, 8]),
    (_na_string, "target", "target", 1, (("non-numeric", 1),), ["n/a"], [11]),
    (_text_column, "target", "target", 1797, (("non-numeric", 1797),), None, [0, 1, 2, 3, 4]),
]
IDS = [f"{damage.__name__.strip('_')}-{role}" for damage, _, role, *_ in CASES]


def damaged(digits, damage, column) -> pd.DataFrame:
    df = digits.copy()
    damage(df, column)
    return df


@pytest.mark.parametrize("damage, column, role, bad_rows, kinds, examples, rows", CASES, ids=IDS)
def test_each_kind_of_bad_value_is_found_with_its_column_count_and_examples(digits, damage, column, role,
                                                                            bad_rows, kinds, examples, rows):
    problem, = find_problems(damaged(digits, damage, column), "target")
    assert (problem.column, problem.role, problem.rows, problem.bad_rows) == (column, role, 1797, bad_rows)
    assert problem.kinds == kinds and list(problem.example_rows) == rows
    if examples is not None:
        assert list(problem.examples) == examples
    text = problem.describe()
    assert f"{role} column {column!r}: {bad_rows} of 1797 rows" in text and f"at rows {rows}" in text


@pytest.mark.parametrize("name", BUILTIN)
def test_builtin_datasets_pass(name):
    assert find_problems(builtin_table(name), "target") == []


def test_every_column_is_reported_in_one_error(digits):
    df = digits.copy()
    _nan_cells(df, "pixel_1_1")
    _na_string(df, "pixel_6_6")
    _inf(df, "target")
    with pytest.raises(UntrainableData) as err:
        check_trainable(df, "target", dataset="/data/digits.parquet")
    assert [(p.column, p.role) for p in err.value.problems] == [
        ("target", "target"), ("pixel_1_1", "feature"), ("pixel_6_6", "feature")]
    message = str(err.value)
    assert message.startswith("dataset /data/digits.parquet cannot be trained on") and "3 columns do not" in message
    assert "feature column 'pixel_6_6': 1 of 1797 rows (0.06%) is not a finite number (1 non-numeric), " \
           "e.g. values ['n/a'] at rows [11]" in message
    assert "nothing was written" in message


def test_only_the_features_given_are_checked_and_missing_columns_are_named(digits):
    df = digits.copy()
    _na_string(df, "pixel_6_6")
    assert find_problems(df, "target", features=["pixel_0_1", "pixel_4_4"]) == []
    missing = {(p.column, p.role): p.describe() for p in find_problems(df, "label", features=["pixel_0_1", "nope"])}
    assert set(missing) == {("label", "target"), ("nope", "feature")}
    assert "target column 'label' is not in the dataset; columns are ['pixel_0_0'" in missing["label", "target"]


def test_numbers_in_object_or_nullable_columns_are_fine_their_gaps_are_not():
    df = pd.DataFrame({"a": pd.Series([1, 2.5, 3], dtype=object), "b": pd.array([1, None, 3], dtype="Int64"),
                       "c": [True, False, True], "target": [0, 1, 0]})
    problem, = find_problems(df, "target")
    assert (problem.column, problem.bad_rows, problem.examples, problem.example_rows) == ("b", 1, (None,), (1,))


def test_problems_are_checked_when_made():
    with pytest.raises(ValueError, match="role"):
        ColumnProblem(column="a", role="label", rows=3, bad_rows=1)
    with pytest.raises(ValueError, match="bad_rows"):
        ColumnProblem(column="a", role="feature", rows=3, bad_rows=0)


# -- the callers: write_shards and `ringflow shard` write nothing ----------------------------------

@pytest.mark.parametrize("damage, column, role, bad_rows, kinds, examples, rows", CASES, ids=IDS)
def test_write_shards_refuses_before_writing_anything(digits, tmp_path, damage, column, role, bad_rows, kinds,
                                                      examples, rows):
    out = tmp_path / "shards"
    with pytest.raises(UntrainableData, match=f"{role} column {column!r}: {bad_rows} of 1797 rows"):
        write_shards(damaged(digits, damage, column), LocalFolderStore(str(out)), target="target",
                     num_partitions=2, batch_size=32)
    assert not out.exists() or not any(out.rglob("*"))


@pytest.mark.parametrize("damage, column", [(_text_column, "pixel_6_6"), (_nan_cells, "target"), (_inf, "pixel_2_2")])
def test_cli_shard_exits_non_zero_with_the_message_and_writes_nothing(digits, tmp_path, capsys, damage, column):
    data = tmp_path / "digits.parquet"
    damaged(digits, damage, column).to_parquet(data)
    out = tmp_path / "shards"
    code = cli.main(["shard", str(data), str(out), "--partitions", "2", "--batch-size", "32"])
    captured = capsys.readouterr()
    assert code != 0
    assert f"column {column!r}" in captured.err and "cannot be trained on" in captured.err
    assert "Traceback" not in captured.err and captured.out == ""
    assert not out.exists() or not any(out.rglob("*"))


def test_cli_shard_of_a_csv_with_n_a_in_a_feature(digits, tmp_path, capsys):
    """CSV readers take "n/a" for a missing value: it is refused as null/NaN, never trained on as NaN."""
    df = digits.copy()
    _na_string(df, "pixel_6_6")
    data = tmp_path / "digits.csv"
    df.to_csv(data, index=False)
    code = cli.main(["shard", str(data), str(tmp_path / "shards"), "--partitions", "2", "--batch-size", "32"])
    assert code != 0
    assert "feature column 'pixel_6_6': 1 of 1797 rows (0.06%) is not a finite number (1 null/NaN)" in \
        capsys.readouterr().err
    assert not (tmp_path / "shards").exists()


# -- streaming and tensor-valued columns -------------------------------------------------------------

def test_streamed_batches_give_the_same_problems_as_the_whole_table(digits):
    import pyarrow as pa

    from ringflow.training.core.input_gate import InputGate

    df = digits.copy()
    _nan_cells(df, "pixel_1_1")
    _inf(df, "target")
    _beyond_float32(df, "pixel_2_2")
    table = pa.Table.from_pandas(df, preserve_index=False)
    gate = InputGate(table.schema.names, "target")
    for batch in table.to_batches(max_chunksize=5):  # rows 4, 9 and 30 fall in different batches
        gate.add(batch)
    assert gate.problems() == find_problems(df, "target") and gate.rows == 1797


def test_a_table_fed_one_column_group_at_a_time_gives_the_same_problems(digits):
    """A wide table is read one column group per pass (datasets.Dataset.column_groups): each column's rows
    still arrive in order, so counts and example rows are those of the whole table."""
    import pyarrow as pa

    from ringflow.training.core.input_gate import InputGate

    df = digits.copy()
    _nan_cells(df, "pixel_1_1")
    _inf(df, "target")
    table = pa.Table.from_pandas(df, preserve_index=False)
    gate = InputGate(table.schema.names, "target")
    names = table.schema.names
    for group in (names[40:], names[:40]):
        for batch in table.select(group).to_batches(max_chunksize=7):
            gate.add(batch)
    assert gate.problems() == find_problems(df, "target") and gate.rows == 1797


def _images(values: np.ndarray):
    import pyarrow as pa

    return pa.table({"image": pa.FixedShapeTensorArray.from_numpy_ndarray(values.astype(np.float32)),
                     "target": np.arange(len(values)) % 2})


@pytest.mark.parametrize("damage, kinds, example", [
    (lambda v: v.__setitem__((2, 0, 1, 1), np.nan), (("null/NaN", 1),), None),
    (lambda v: v.__setitem__((2, 0, 0, 1), -np.inf), (("inf", 1),), float("-inf")),
])
def test_every_element_of_a_tensor_column_must_be_finite(damage, kinds, example):
    values = np.ones((6, 1, 2, 2))
    damage(values)
    problem, = find_problems(_images(values), "target")
    assert (problem.column, problem.bad_rows, problem.kinds, problem.example_rows) == ("image", 1, kinds, (2,))
    assert problem.examples == (example,)


def test_a_null_image_a_variable_length_list_and_text_lists_are_refused():
    import pyarrow as pa

    table = pa.table({
        "image": pa.array([[1.0, 2.0], None, [3.0, 4.0]], pa.list_(pa.float32(), 2)),
        "tokens": pa.array([[1, 2], [3], [4, 5, 6]], pa.list_(pa.int64())),
        "words": pa.array([["a", "b"], ["c", "d"], ["e", "f"]], pa.list_(pa.string(), 2)),
        "target": [0, 1, 0]})
    found = {p.column: (p.bad_rows, p.kinds) for p in find_problems(table, "target")}
    assert found == {"image": (1, (("null/NaN", 1),)), "tokens": (3, (("variable-length list", 3),)),
                     "words": (3, (("non-numeric", 3),))}


def test_the_image_builtin_passes_and_shards_with_its_shape(tmp_path):
    from ringflow.training.formats.datasets import builtin_table

    manifest = write_shards(builtin_table("digits_images"), LocalFolderStore(str(tmp_path)), target="target",
                            num_partitions=2, batch_size=32)
    assert manifest.schema.columns[0].shape == (1, 8, 8)

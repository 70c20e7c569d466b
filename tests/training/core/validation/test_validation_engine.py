"""The validation engine (ringflow.training.core.validation) on tables: suites, summaries, the input gate,
what streams exactly and what is sampled."""
from __future__ import annotations

import dataclasses
import pathlib

import numpy as np
import pytest

from validation_cases import broken, digits, digits_suite, untrainable  # noqa: F401 - fixtures

from ringflow.training.core.validation.gx_run import run_suite, summarize
from ringflow.training.core.validation.scopes import EVERY_ROW, ROW_COUNT, SAMPLE, SCHEMA, expectation_scope
from ringflow.training.core.validation.stream import validate_dataset
from ringflow.training.core.validation.suite import SuiteError, load_suite
from ringflow.training.formats.datasets import as_dataset, builtin_table

SUITES = pathlib.Path(__file__).parents[3] / "operators" / "suites"


def validate(df, suite, batch_rows=500):
    """The streaming path, in batches of 500 rows (digits: 4 batches), so every count and example is added
    up across batches; test_streamed_results_equal_the_whole_table_s checks it against one whole-table run."""
    suite = load_suite(suite)
    return validate_dataset(as_dataset(df), suite, batch_rows=batch_rows)


def test_default_suite_passes_on_digits(digits):
    summary = validate(digits, digits_suite(digits))
    assert summary.success, summary.message("digits")
    assert (summary.rows, summary.columns, summary.suite) == (1797, 65, "digits-default")
    assert summary.evaluated == len(digits_suite(digits)["expectations"])


def test_broken_copy_fails_with_what_how_many_and_examples(broken):
    summary = validate(broken, digits_suite(broken))
    failed = {(f.expectation, f.kwargs.get("column")): f for f in summary.failures}
    assert set(failed) == {("expect_column_values_to_not_be_null", "pixel_0_1"),
                           ("expect_column_values_to_be_in_set", "target")}
    nulls = failed["expect_column_values_to_not_be_null", "pixel_0_1"]
    assert nulls.unexpected_count == 3 and nulls.example_rows == [1, 2, 3]
    label = failed["expect_column_values_to_be_in_set", "target"]
    assert label.unexpected_count == 1 and label.examples == [42] and label.example_rows == [5]

    message = summary.message("/data/digits.csv")
    assert "failed 2 of" in message and "/data/digits.csv (1797 rows, 65 columns)" in message
    assert "expect_column_values_to_not_be_null(column='pixel_0_1'): 3 unexpected rows (0.17%)" in message
    assert "(0.17%) at rows [1, 2, 3]" in message  # no "e.g. values [None, ...]" for a null check
    assert "expect_column_values_to_be_in_set(column='target'" in message
    assert "1 unexpected row (0.06%), e.g. values [42] at rows [5]" in message


def test_out_of_range_and_missing_columns_are_reported(digits):
    df = digits.copy()
    df.loc[7, "pixel_3_3"] = 99.0
    summary = validate(df, [
        {"type": "expect_column_values_to_be_between", "kwargs": {"column": "pixel_3_3", "min_value": 0, "max_value": 16}},
        {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "label"}},
        {"type": "expect_table_row_count_to_be_between", "kwargs": {"min_value": 5000}},
    ])
    text = summary.message("d")
    assert "pixel_3_3" in text and "e.g. values [99.0] at rows [7]" in text
    assert "expect_column_values_to_not_be_null(column='label'): could not be checked" in text and "label" in text
    assert "expect_table_row_count_to_be_between(min_value=5000): observed 1797" in text


def test_suite_from_a_json_file_relative_to_the_dag_folder(digits, broken):
    suite = load_suite("digits.json", base_dir=str(SUITES))
    assert suite["name"] == "digits" and len(suite["expectations"]) == 9
    assert validate(digits, suite).success
    failed = {f.kwargs.get("column") for f in validate(broken, suite).failures}
    assert failed == {"pixel_0_1", "target"}


@pytest.mark.parametrize("spec, match", [
    ([], "no expectations"),
    ({"name": "x"}, '"expectations" list'),
    ([{"kwargs": {}}], "expectation #0"),
    ("no-such-suite.json", "does not exist"),
])
def test_malformed_suites_are_refused_before_any_data_is_read(spec, match, tmp_path):
    with pytest.raises(SuiteError, match=match):
        load_suite(spec, base_dir=str(tmp_path))


def test_unknown_expectation_names_the_entry_to_fix(digits):
    with pytest.raises(SuiteError, match=r"expectation #1 .*expect_colum_values_to_be_nul"):
        validate(digits, [{"type": "expect_table_row_count_to_be_between", "kwargs": {"min_value": 1}},
                          {"type": "expect_colum_values_to_be_nul", "kwargs": {"column": "target"}}])


# -- the input gate: feature and target columns hold finite numbers, whatever the suite says ---------

def test_data_the_suite_passes_still_fails_when_training_cannot_use_it(untrainable):
    suite = load_suite(str(SUITES / "digits.json"))
    result = run_suite(untrainable, suite)
    assert summarize(result, suite["name"], untrainable).success  # without a target: the suite alone
    summary = summarize(result, suite["name"], untrainable, target="target")
    assert not summary.success and summary.failures == []
    assert [(p.column, p.bad_rows, list(p.example_rows)) for p in summary.untrainable] == [
        ("pixel_1_1", 2, [10, 20]), ("pixel_2_2", 1, [30])]
    message = summary.message("/data/digits.csv")
    assert "passed all 9 expectations of suite 'digits', but:" in message
    assert "feature column 'pixel_1_1': 2 of 1797 rows (0.11%) are not finite numbers (2 null/NaN), " \
           "e.g. values [None, None] at rows [10, 20]" in message
    assert "feature column 'pixel_2_2': 1 of 1797 rows (0.06%) is not a finite number (1 inf), " \
           "e.g. values [inf] at rows [30]" in message


# -- streaming: what is exact, what is sampled ----------------------------------------------------

@pytest.mark.parametrize("expectation, scope", [
    ("expect_column_values_to_not_be_null", EVERY_ROW),
    ("expect_column_values_to_be_between", EVERY_ROW),
    ("expect_column_values_to_be_in_set", EVERY_ROW),
    ("expect_column_values_to_be_in_type_list", EVERY_ROW),
    ("expect_column_values_to_match_regex", EVERY_ROW),
    ("expect_column_tensor_values_to_be_between", EVERY_ROW),
    ("expect_column_to_exist", SCHEMA),
    ("expect_table_column_count_to_equal", SCHEMA),
    ("expect_column_values_to_be_tensors", SCHEMA),
    ("expect_table_row_count_to_be_between", ROW_COUNT),
    ("expect_column_mean_to_be_between", SAMPLE),
    ("expect_column_unique_value_count_to_be_between", SAMPLE),
    ("expect_column_values_to_be_unique", SAMPLE),  # a map expectation, but rows against rows: not per batch
])
def test_each_expectation_has_a_scope(expectation, scope):
    assert expectation_scope(expectation) == scope


def test_streamed_results_equal_the_whole_tables(broken):
    suite = load_suite(str(SUITES / "digits.json"))
    whole = summarize(run_suite(broken, suite), suite["name"], broken)
    for batch_rows in (100, 1797):
        streamed = validate(broken, suite, batch_rows=batch_rows)
        assert [dataclasses.replace(f, scope=EVERY_ROW, sample_rows=0) for f in streamed.failures] == whole.failures
        assert (streamed.rows, streamed.columns, streamed.evaluated) == (whole.rows, whole.columns, whole.evaluated)
    assert streamed.scopes[SAMPLE] == ("expect_column_mean_to_be_between",) and streamed.sample_rows == 1797


def test_aggregates_run_on_a_bounded_sample_and_say_so(digits, monkeypatch):
    from ringflow.training.core.validation import stream as module

    monkeypatch.setattr(module, "SAMPLE_ROWS", 300)
    summary = validate(digits, [{"type": "expect_column_mean_to_be_between",
                                 "kwargs": {"column": "target", "min_value": 100}},
                                {"type": "expect_table_row_count_to_equal", "kwargs": {"value": 1797}}])
    failure, = summary.failures  # the row count is exact, not the sample's 300
    assert failure.scope == SAMPLE and summary.sample_rows == 300
    assert "[on a sample of 300 rows]: observed" in failure.describe()
    again = validate(digits, [{"type": "expect_column_mean_to_be_between", "kwargs": {"column": "target", "min_value": 100}}])
    assert again.failures[0].observed == failure.observed  # the same rows for the same data


def test_mostly_is_judged_over_all_batches(digits):
    df = digits.copy()
    df.loc[:99, "pixel_3_3"] = 99.0  # 100 bad rows, all in the first batch: 5.6% of the table
    exp = {"type": "expect_column_values_to_be_between",
           "kwargs": {"column": "pixel_3_3", "min_value": 0, "max_value": 16, "mostly": 0.9}}
    assert validate(df, [exp], batch_rows=200).success  # the first batch alone would fail at 50%
    failed = validate(df, [{**exp, "kwargs": {**exp["kwargs"], "mostly": 0.95}}], batch_rows=200)
    assert failed.failures[0].unexpected_count == 100 and failed.failures[0].example_rows == [0, 1, 2, 3, 4]


IMAGE_SUITE = pathlib.Path(__file__).parents[4] / "dags" / "suites" / "digits_images.json"


def test_the_image_suite_checks_the_image_column():
    table = builtin_table("digits_images")
    suite = load_suite(str(IMAGE_SUITE))
    assert validate_dataset(as_dataset(table), suite, target="target", batch_rows=400).success
    images = table.column("image").combine_chunks().to_numpy_ndarray().copy()
    images[3, 0, 2, 2] = 40.0  # a pixel out of range
    images[7, 0, 5, 1] = np.nan  # and one that is not a number
    import pyarrow as pa
    broken = table.set_column(0, "image", pa.FixedShapeTensorArray.from_numpy_ndarray(images))
    summary = validate_dataset(as_dataset(broken), suite, target="target", batch_rows=400)
    failure, = summary.failures
    assert (failure.expectation, failure.unexpected_count, failure.examples, failure.example_rows) == (
        "expect_column_tensor_values_to_be_between", 1, [40.0], [3])
    problem, = summary.untrainable  # NaN is not out of range, but training cannot use it
    assert (problem.column, problem.bad_rows, list(problem.example_rows)) == ("image", 1, [7])
    flat = pa.table({"image": pa.array(images.reshape(len(images), -1).tolist(), pa.list_(pa.float32(), 64)),
                     "target": table.column("target")})
    shape_failure = validate_dataset(as_dataset(flat), suite, target="target").failures
    assert any(f.expectation == "expect_column_values_to_be_tensors" and f.observed == {"shape": [64], "dtype": "float32"}
               for f in shape_failure)


@pytest.mark.parametrize("kwargs, passes", [
    ({"min_value": 1797}, True), ({"min_value": 1798}, False), ({"max_value": 1797}, True),
    ({"max_value": 1797, "strict_max": True}, False), ({"min_value": 1797, "strict_min": True}, False),
    ({"min_value": 10, "max_value": 2000}, True),
])
def test_row_counts_are_judged_on_the_exact_count_like_gx_does(digits, kwargs, passes):
    exp = {"type": "expect_table_row_count_to_be_between", "kwargs": kwargs}
    assert validate(digits, [exp]).success == passes == summarize(run_suite(digits, load_suite([exp])), "s", digits).success


@pytest.mark.parametrize("kwargs, columns", [
    ({"column": "a", "min_value": 0}, ("a",)),
    ({"column_A": "a", "column_B": "b"}, ("a", "b")),
    ({"column_list": ["c", "a"]}, ("c", "a")),
    ({"column": "a", "row_condition": 'b > 0', "condition_parser": "pandas"}, None),  # names columns in its syntax
    ({"value": 10}, None),  # the whole table
])
def test_an_expectation_reads_the_columns_it_names(kwargs, columns):
    from ringflow.training.core.validation.scopes import expectation_columns

    assert expectation_columns({"type": "expect_x", "kwargs": kwargs}) == columns


def test_a_parquet_file_read_in_column_groups_gives_the_same_summary(broken, tmp_path, monkeypatch):
    """A wide Parquet table is read one column group per pass (datasets.Dataset.column_groups), each
    expectation given only the columns it names: every count, example row, sampled aggregate and input-gate
    finding is the one of the whole table."""
    from ringflow.training.formats import datasets
    from ringflow.training.formats.datasets import open_dataset

    df = broken.copy()
    df.loc[[10, 20], "pixel_7_7"] = np.nan  # training cannot use it; the suite does not look
    df.to_parquet(tmp_path / "digits.parquet", row_group_size=300)
    suite = load_suite({"name": "wide", "expectations": [
        *digits_suite(broken)["expectations"][:40],
        {"type": "expect_column_values_to_be_in_set", "kwargs": {"column": "target", "value_set": list(range(10))}},
        {"type": "expect_column_pair_values_a_to_be_greater_than_b",  # two columns, in different groups
         "kwargs": {"column_A": "pixel_0_0", "column_B": "pixel_6_3", "or_equal": True}},
        {"type": "expect_column_mean_to_be_between", "kwargs": {"column": "pixel_5_5", "max_value": 1}},
        {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "label"}},  # not in the dataset
        {"type": "expect_table_column_count_to_equal", "kwargs": {"value": 65}},
    ]})
    whole = validate_dataset(as_dataset(df), suite, target="target", batch_rows=500)
    assert {f.expectation for f in whole.failures} == {
        "expect_column_values_to_not_be_null", "expect_column_values_to_be_in_set",
        "expect_column_pair_values_a_to_be_greater_than_b", "expect_column_mean_to_be_between"}
    assert [p.column for p in whole.untrainable] == ["pixel_0_1", "pixel_7_7"]
    monkeypatch.setattr(datasets, "READ_BYTES", 1)  # one pass per column (the pair: one pass for both)
    with open_dataset(str(tmp_path / "digits.parquet")) as dataset:
        assert len(dataset.column_groups()) == 65
        grouped = validate_dataset(dataset, suite, target="target", batch_rows=500)
    assert grouped == whole

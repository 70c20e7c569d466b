"""Dataset validation with Great Expectations: the pure functions on DataFrames, then the operator on
files (CSV, Parquet, S3 through an Airflow connection)."""
from __future__ import annotations

import io
import json
import pathlib

import numpy as np
import pytest

from ringflow.operators.validate import (
    DataValidationError, SuiteError, ValidateDatasetOperator, default_suite, load_suite, run_suite, summarize,
)
from ringflow.training.datasets import load_builtin

SUITES = pathlib.Path(__file__).parent / "suites"


@pytest.fixture(scope="module")
def digits():
    return load_builtin("digits")


@pytest.fixture(scope="module")
def broken(digits):
    """Digits with three missing pixels and one impossible label: the kinds of damage a bad export does."""
    df = digits.copy()
    df.loc[[1, 2, 3], "pixel_0_1"] = np.nan
    df.loc[5, "target"] = 42
    return df


def digits_suite(df):
    features = [c for c in df.columns if c != "target"]
    return default_suite("target", features, target_values=range(10), feature_range=(0, 16), name="digits-default")


def validate(df, suite):
    suite = load_suite(suite)
    return summarize(run_suite(df, suite), suite["name"], df)


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


# -- the operator --------------------------------------------------------------------------------

def test_operator_passes_builtin_digits_and_returns_a_small_summary(digits):
    op = ValidateDatasetOperator(task_id="validate", dataset_uri="builtin:digits", suite=digits_suite(digits))
    assert op.execute(context={}) == {"dataset": "builtin:digits", "rows": 1797, "columns": 65,
                                      "suite": "digits-default", "expectations": 1 + 65 * 2 + 1 + 64 * 2}


def test_operator_fails_a_broken_csv_with_the_summary(broken, tmp_path):
    path = tmp_path / "digits.csv"
    broken.to_csv(path, index=False)
    op = ValidateDatasetOperator(task_id="validate", dataset_uri=str(path), suite=digits_suite(broken))
    with pytest.raises(DataValidationError) as excinfo:
        op.execute(context={})
    assert str(path) in str(excinfo.value) and "pixel_0_1" in str(excinfo.value) and "[42]" in str(excinfo.value)
    assert len(excinfo.value.summary.failures) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["digits.csv"]  # validation writes nothing


def test_operator_reads_the_suite_file_next_to_the_dag(digits, tmp_path):
    from airflow.sdk import DAG

    digits.to_parquet(tmp_path / "digits.parquet")
    with DAG("validate_test", schedule=None) as dag:  # its fileloc is this test file
        op = ValidateDatasetOperator(task_id="validate", dataset_uri=f"file://{tmp_path}/digits.parquet",
                                     suite="suites/digits.json")
    assert pathlib.Path(dag.fileloc).parent == SUITES.parent
    assert op.execute(context={})["suite"] == "digits"


@pytest.mark.slow
def test_operator_reads_a_dataset_from_s3_through_the_connection(broken, digits, s3_server, s3_connection):
    bucket = s3_server.new_bucket()
    client = s3_server.boto3_client()
    for name, df in (("good", digits), ("broken", broken)):
        buf = io.BytesIO()
        df.to_parquet(buf)
        client.put_object(Bucket=bucket, Key=f"data/{name}.parquet", Body=buf.getvalue())
    suite = str(SUITES / "digits.json")

    good = ValidateDatasetOperator(task_id="v", dataset_uri=f"s3://{bucket}/data/good.parquet", suite=suite)
    assert good.execute(context={})["rows"] == 1797
    bad = ValidateDatasetOperator(task_id="v", dataset_uri=f"s3://{bucket}/data/broken.parquet", suite=suite,
                                  conn_id=s3_connection)
    with pytest.raises(DataValidationError, match="pixel_0_1"):
        bad.execute(context={})
    assert json.loads(json.dumps(good.execute(context={})))  # the XCom value is plain JSON

"""The validate operator on files (CSV, Parquet, S3 through an Airflow connection); the engine it runs is
tested on tables in tests/training/core/validation."""
from __future__ import annotations

import io
import json
import pathlib

import pytest

from validation_cases import broken, digits, digits_suite, untrainable  # noqa: F401 - fixtures

from ringflow.operators.validate import DataValidationError, ValidateDatasetOperator

SUITES = pathlib.Path(__file__).parent / "suites"


# -- the operator --------------------------------------------------------------------------------

def test_operator_passes_builtin_digits_and_returns_a_small_summary(digits):
    op = ValidateDatasetOperator(task_id="validate", dataset_uri="builtin:digits", suite=digits_suite(digits))
    assert op.execute(context={}) == {"dataset": "builtin:digits", "rows": 1797, "columns": 65,
                                      "suite": "digits-default", "expectations": 1 + 65 * 2 + 1 + 64 * 2,
                                      "sampled": [], "sample_rows": 0}


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


@pytest.mark.job
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


def test_operator_fails_untrainable_columns_of_a_csv_and_writes_nothing(untrainable, tmp_path):
    df = untrainable.copy()
    df["target"] = df["target"].astype(object)
    df.loc[40, "target"] = "n/a"  # CSV readers take "n/a" for a missing value
    path = tmp_path / "digits.csv"
    df.to_csv(path, index=False)
    op = ValidateDatasetOperator(task_id="validate", dataset_uri=str(path), suite=str(SUITES / "digits.json"))
    with pytest.raises(DataValidationError) as excinfo:
        op.execute(context={})
    summary = excinfo.value.summary
    assert [(p.column, p.role) for p in summary.untrainable] == [
        ("target", "target"), ("pixel_1_1", "feature"), ("pixel_2_2", "feature")]
    assert "target column 'target': 1 of 1797 rows (0.06%) is not a finite number (1 null/NaN)" in str(excinfo.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["digits.csv"]


def test_operator_checks_the_target_it_is_given(digits, tmp_path):
    df = digits.rename(columns={"target": "label"})
    df["pixel_5_5"] = ["dark" if v > 8 else "light" for v in df["pixel_5_5"]]
    df.to_parquet(tmp_path / "d.parquet")
    suite = [{"type": "expect_table_row_count_to_be_between", "kwargs": {"min_value": 1}}]
    op = ValidateDatasetOperator(task_id="v", dataset_uri=str(tmp_path / "d.parquet"), suite=suite, target="label")
    with pytest.raises(DataValidationError, match=r"feature column 'pixel_5_5': 1797 of 1797 rows \(100.00%\) are "
                                                  r"not finite numbers \(1797 non-numeric\), e.g. values \['dark', 'light'"):
        op.execute(context={})
    default_target = ValidateDatasetOperator(task_id="v", dataset_uri="builtin:digits", suite=suite)
    assert default_target.target == "target" and default_target.execute(context={})["rows"] == 1797

"""Digits datasets and the suite every training dataset needs, shared by the validation engine's tests
(tests/training/core/validation) and the validate operator's (tests/operators)."""
from __future__ import annotations

import numpy as np
import pytest

from ringflow.training.formats.datasets import load_builtin

# Numeric dtypes a feature column may have (numpy names, plus pandas' nullable ones).
NUMERIC_TYPES = [f"int{b}" for b in (8, 16, 32, 64)] + [f"uint{b}" for b in (8, 16, 32, 64)] + [
    "float16", "float32", "float64", "Int8Dtype", "Int16Dtype", "Int32Dtype", "Int64Dtype",
    "Float32Dtype", "Float64Dtype"]


def digits_suite(df):
    """The checks every training dataset needs, for digits: rows present, no nulls, numeric pixels in 0..16,
    a label in 0..9."""
    def exp(type_, **kwargs):
        return {"type": type_, "kwargs": kwargs}

    features = [c for c in df.columns if c != "target"]
    exps = [exp("expect_table_row_count_to_be_between", min_value=1)]
    for column in ["target", *features]:
        exps += [exp("expect_column_to_exist", column=column), exp("expect_column_values_to_not_be_null", column=column)]
    exps.append(exp("expect_column_values_to_be_in_set", column="target", value_set=list(range(10))))
    for column in features:
        exps += [exp("expect_column_values_to_be_in_type_list", column=column, type_list=NUMERIC_TYPES),
                 exp("expect_column_values_to_be_between", column=column, min_value=0, max_value=16)]
    return {"name": "digits-default", "expectations": exps}


def broken_digits(digits):
    """Digits with three missing pixels and one impossible label: the kinds of damage a bad export does."""
    df = digits.copy()
    df.loc[[1, 2, 3], "pixel_0_1"] = np.nan
    df.loc[5, "target"] = 42
    return df


def untrainable_digits(digits):
    """Digits that pass the digits suite (which names neither column) but cannot be trained on."""
    df = digits.copy()
    df.loc[[10, 20], "pixel_1_1"] = np.nan
    df["pixel_2_2"] = df["pixel_2_2"].astype("float64")
    df.loc[[30], "pixel_2_2"] = np.inf
    return df


@pytest.fixture(scope="module")
def digits():
    return load_builtin("digits")


@pytest.fixture(scope="module")
def broken(digits):
    return broken_digits(digits)


@pytest.fixture(scope="module")
def untrainable(digits):
    return untrainable_digits(digits)

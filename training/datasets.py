"""Small real datasets that ship inside registry packages, for the demo and the tests (no downloads)."""
from __future__ import annotations

import pandas as pd

BUILTIN = ("digits", "diabetes", "wine")


def load_builtin(name: str) -> pd.DataFrame:
    """scikit-learn's bundled datasets as one table: feature columns plus `target`."""
    from sklearn import datasets

    loaders = {"digits": datasets.load_digits, "diabetes": datasets.load_diabetes, "wine": datasets.load_wine}
    if name not in loaders:
        raise ValueError(f"unknown built-in dataset {name!r}; use one of {BUILTIN}")
    frame = loaders[name](as_frame=True).frame
    frame.columns = [str(c).replace(" ", "_") for c in frame.columns]
    return frame


def check_table_name(uri: str) -> None:
    """Fail before any read when a dataset file is neither Parquet nor CSV."""
    if not uri.endswith((".parquet", ".csv")):
        raise ValueError(f"dataset {uri!r}: use a .parquet or .csv file, or builtin:<name>")


def parse_table(name: str, data: bytes) -> pd.DataFrame:
    """A Parquet or CSV file's bytes as a table, by the file's name."""
    import io

    check_table_name(name)
    return pd.read_parquet(io.BytesIO(data)) if name.endswith(".parquet") else pd.read_csv(io.BytesIO(data))


def read_table(uri: str, s3=None) -> pd.DataFrame:
    """A dataset by URI: `builtin:digits`, or a Parquet/CSV file as a path, file:// or s3:// URI
    (S3 settings from `s3`, else from the environment)."""
    if uri.startswith("builtin:"):
        return load_builtin(uri.split(":", 1)[1])
    from ringflow.training.store import open_store, split_uri

    check_table_name(uri)
    parent, name = split_uri(uri)
    return parse_table(name, open_store(parent, s3=s3).get_bytes(name))

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


def read_table(uri: str) -> pd.DataFrame:
    """A dataset by URI: `builtin:digits`, or a Parquet/CSV file as a path, file:// or s3:// URI."""
    if uri.startswith("builtin:"):
        return load_builtin(uri.split(":", 1)[1])
    import io

    from ringflow.training.store import open_store, split_uri

    parent, name = split_uri(uri)
    data = open_store(parent).get_bytes(name)
    if name.endswith(".parquet"):
        return pd.read_parquet(io.BytesIO(data))
    if name.endswith(".csv"):
        return pd.read_csv(io.BytesIO(data))
    raise ValueError(f"dataset {uri!r}: use a .parquet or .csv file, or builtin:<name>")

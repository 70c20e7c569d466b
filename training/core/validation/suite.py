"""A suite is plain data, so it can live in the DAG file or in a JSON file next to it:

    {"name": "digits", "expectations": [
        {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "target"}}, ...]}

load_suite reads and checks that form; build_suite makes Great Expectations' suite of it (GX imported inside).
"""
from __future__ import annotations

import json
import os
import pathlib
from typing import Any, Mapping, Sequence

from .scopes import RINGFLOW_EXPECTATIONS, TENSOR_RANGE, TENSOR_SHAPE

EXPECTATIONS_URL = "https://greatexpectations.io/expectations/"


class SuiteError(ValueError):
    """The suite itself is malformed; the message says which expectation to fix."""


def load_suite(spec: Sequence[Mapping] | Mapping | str | os.PathLike, base_dir: str | None = None,
               name: str = "ringflow-suite") -> dict[str, Any]:
    """A suite in its JSON-file form from: a list of expectation configs, a `{"name", "expectations"}`
    dict, or the path of such a JSON file (relative paths from `base_dir`, the DAG's folder)."""
    if isinstance(spec, (str, os.PathLike)):
        path = pathlib.Path(spec)
        if not path.is_absolute() and base_dir:
            path = pathlib.Path(base_dir) / path
        try:
            doc = json.loads(path.read_text())
        except FileNotFoundError as exc:
            raise SuiteError(f"suite file {str(path)!r} does not exist; put it next to the DAG file or pass "
                             f"an absolute path") from exc
        except json.JSONDecodeError as exc:
            raise SuiteError(f"suite file {str(path)!r} is not valid JSON ({exc})") from exc
        if isinstance(doc, dict):
            doc.setdefault("name", path.stem)
        spec = doc
    if isinstance(spec, Mapping):
        if "expectations" not in spec:
            raise SuiteError('a suite dict needs an "expectations" list: {"name": ..., "expectations": [...]}')
        name, exps = str(spec.get("name") or name), spec["expectations"]
    else:
        exps = spec
    if isinstance(exps, (str, bytes)) or not isinstance(exps, Sequence) or not exps:
        raise SuiteError("the suite has no expectations; give a non-empty list of "
                         '{"type": "expect_...", "kwargs": {...}} dicts')
    for i, e in enumerate(exps):
        if not isinstance(e, Mapping) or not isinstance(e.get("type"), str) or not isinstance(e.get("kwargs", {}), Mapping):
            raise SuiteError(f"expectation #{i} of suite {name!r} is {e!r}; write it as "
                             f'{{"type": "expect_...", "kwargs": {{...}}}}')
    return {"name": name, "expectations": [{"type": e["type"], "kwargs": dict(e.get("kwargs", {})),
                                            **({"meta": e["meta"]} if "meta" in e else {})} for e in exps]}


def build_suite(gx: Any, suite: Mapping[str, Any]) -> Any:
    from great_expectations.expectations.expectation_configuration import ExpectationConfiguration

    built = []
    for i, e in enumerate(suite["expectations"]):
        if e["type"] in RINGFLOW_EXPECTATIONS:
            _check_ringflow_expectation(i, suite["name"], e)
            continue
        try:
            built.append(ExpectationConfiguration(type=e["type"], kwargs=e["kwargs"], meta=e.get("meta")).to_domain_obj())
        except Exception as exc:  # unknown type (ExpectationNotFoundError) or bad kwargs (pydantic)
            raise SuiteError(
                f"expectation #{i} of suite {suite['name']!r} ({e['type']}, kwargs {e['kwargs']}) is invalid: "
                f"{str(exc).strip()}. Check its name and arguments at {EXPECTATIONS_URL}"
            ) from exc
    return gx.ExpectationSuite(name=suite["name"], expectations=built)


def _check_ringflow_expectation(i: int, name: str, e: Mapping[str, Any]) -> None:
    kwargs = e["kwargs"]
    needs = {TENSOR_SHAPE: ("column", "shape"), TENSOR_RANGE: ("column",)}[e["type"]]
    missing = [k for k in needs if k not in kwargs]
    if missing or (e["type"] == TENSOR_SHAPE and not isinstance(kwargs.get("shape"), Sequence)):
        raise SuiteError(f"expectation #{i} of suite {name!r} ({e['type']}, kwargs {dict(kwargs)}) needs "
                         f"{list(needs)}; e.g. {{\"column\": \"image\", \"shape\": [1, 8, 8], \"dtype\": \"float32\"}}")

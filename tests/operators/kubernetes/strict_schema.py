"""Strict validation against the MPIJob CRD schema (kubeflow/mpi-operator v0.8.2), as `kubectl --validate=strict`.

Kubernetes prunes unknown fields instead of rejecting them, so a typo (`tolerationSeconds` spelled wrong, a
field in the wrong place) would silently vanish on a real cluster. Here every object schema that lists
`properties` and does not say `x-kubernetes-preserve-unknown-fields` is closed: unknown fields fail.

The schema lives in the shared reference folder next to the repo root (`../shared/reference/`), or under
$RINGFLOW_SHARED_DIR/reference when that is set.
"""
from __future__ import annotations

import copy
import functools
import json
import os
import pathlib
from typing import Any

REPO_ROOT = pathlib.Path(__file__).resolve().parents[3]


def shared_dir() -> pathlib.Path:
    env = os.environ.get("RINGFLOW_SHARED_DIR")
    return pathlib.Path(env) if env else REPO_ROOT.parent / "shared"


def reference(name: str) -> pathlib.Path:
    return shared_dir() / "reference" / name


def _close(node: Any) -> Any:
    if isinstance(node, dict):
        node = {k: _close(v) for k, v in node.items()}
        if "properties" in node and not node.get("x-kubernetes-preserve-unknown-fields") \
                and "additionalProperties" not in node:
            node["additionalProperties"] = False
        return node
    if isinstance(node, list):
        return [_close(v) for v in node]
    return node


@functools.lru_cache(maxsize=1)
def _validator() -> Any:
    import jsonschema

    path = reference("mpijob-v2beta1.schema.json")
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: set RINGFLOW_SHARED_DIR to the folder that holds reference/")
    schema = _close(json.loads(path.read_text()))
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft7Validator)
    return cls(schema)


def errors(mpijob: dict[str, Any]) -> list[str]:
    """Every schema violation, as 'path: message' lines (empty when valid)."""
    out = []
    for err in sorted(_validator().iter_errors(copy.deepcopy(mpijob)), key=lambda e: list(map(str, e.path))):
        out.append(f"{'/'.join(map(str, err.path)) or '<root>'}: {err.message}")
    return out


def assert_valid(mpijob: dict[str, Any]) -> None:
    problems = errors(mpijob)
    assert not problems, "MPIJob does not match the CRD schema:\n" + "\n".join(problems)

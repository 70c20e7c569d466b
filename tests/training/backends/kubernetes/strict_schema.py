"""Strict validation against the MPIJob CRD schema (kubeflow/mpi-operator v0.8.2), as `kubectl --validate=strict`.

Kubernetes prunes unknown fields instead of rejecting them, so a typo (`tolerationSeconds` spelled wrong, a
field in the wrong place) would silently vanish on a real cluster. Here every object schema that lists
`properties` and does not say `x-kubernetes-preserve-unknown-fields` is closed: unknown fields fail.

The schema is a copy kept in the repository, tests/fixtures/crds/ (its source and version are named in
tests/fixtures/README.md), so a fresh clone needs nothing outside it.
"""
from __future__ import annotations

import copy
import functools
import json
import pathlib
from typing import Any

REPO_ROOT = pathlib.Path(__file__).resolve().parents[4]
SCHEMA = REPO_ROOT / "tests" / "fixtures" / "crds" / "mpijob-v2beta1.schema.json"


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

    schema = _close(json.loads(SCHEMA.read_text()))
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

"""Strict validation against CRD schemas, as `kubectl --validate=strict`: the MPIJob's (kubeflow/mpi-operator
v0.8.2), and the TrainJob's and ClusterTrainingRuntime's (kubeflow/trainer v2.3.0), chosen by the object's kind.

Kubernetes prunes unknown fields instead of rejecting them, so a typo (`tolerationSeconds` spelled wrong, a
field in the wrong place) would silently vanish on a real cluster. Here every object schema that lists
`properties` and does not say `x-kubernetes-preserve-unknown-fields` is closed: unknown fields fail.

The schemas are copies kept in the repository, tests/fixtures/crds/ (their source and version are named in
tests/fixtures/README.md), so a fresh clone needs nothing outside it. CEL rules (x-kubernetes-validations)
are not evaluated here.
"""
from __future__ import annotations

import copy
import functools
import json
import pathlib
from typing import Any

REPO_ROOT = pathlib.Path(__file__).resolve().parents[5]
CRDS = REPO_ROOT / "tests" / "fixtures" / "crds"
SCHEMA = CRDS / "mpijob-v2beta1.schema.json"
SCHEMAS = {
    ("kubeflow.org/v2beta1", "MPIJob"): SCHEMA,
    ("trainer.kubeflow.org/v1alpha1", "TrainJob"): CRDS / "trainjob-v1alpha1.schema.json",
    ("trainer.kubeflow.org/v1alpha1", "ClusterTrainingRuntime"): CRDS / "clustertrainingruntime-v1alpha1.schema.json",
}


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


@functools.lru_cache(maxsize=None)
def _validator(path: pathlib.Path) -> Any:
    import jsonschema

    schema = _close(json.loads(path.read_text()))
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft7Validator)
    return cls(schema)


def _schema_for(obj: dict[str, Any]) -> pathlib.Path:
    # An object without apiVersion/kind is checked as an MPIJob, as before there were several schemas.
    key = (obj.get("apiVersion", "kubeflow.org/v2beta1"), obj.get("kind", "MPIJob"))
    assert key in SCHEMAS, f"no CRD schema for {key}; known: {sorted(SCHEMAS)}"
    return SCHEMAS[key]


def errors(obj: dict[str, Any]) -> list[str]:
    """Every schema violation, as 'path: message' lines (empty when valid)."""
    out = []
    validator = _validator(_schema_for(obj))
    for err in sorted(validator.iter_errors(copy.deepcopy(obj)), key=lambda e: list(map(str, e.path))):
        out.append(f"{'/'.join(map(str, err.path)) or '<root>'}: {err.message}")
    return out


def assert_valid(obj: dict[str, Any]) -> None:
    problems = errors(obj)
    assert not problems, f"{obj.get('kind', 'MPIJob')} does not match the CRD schema:\n" + "\n".join(problems)

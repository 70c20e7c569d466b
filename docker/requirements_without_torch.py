"""Print ringflow's requirements for the Airflow image: the core, `airflow` and `mlflow` extras, minus torch.

The Airflow image installs torch itself, the CPU build from the CPU wheel index (the evaluate step runs a
forward pass in the Airflow worker); listed here, pip would take PyPI's build with gigabytes of CUDA
libraries. So the image installs these requirements plus CPU torch, then ringflow with `--no-deps`.
apache-airflow is left out as well: the base image has it, and the Dockerfile pins it to the same version.

--core: the core requirements alone, minus torch: the training image's TensorFlow venv (a TF rank needs the
data and store stack, never torch, Airflow or the Kubernetes client).

usage: python requirements_without_torch.py [--core] pyproject.toml > requirements.txt
"""
from __future__ import annotations

import re
import sys
import tomllib

EXCLUDED = {"torch", "horovod", "apache-airflow"}


def name(requirement: str) -> str:
    return re.split(r"[\s\[<>=!~;]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


def requirements(pyproject: dict, core_only: bool = False) -> list[str]:
    project = pyproject["project"]
    extras = project["optional-dependencies"]
    wanted = list(project["dependencies"])
    if not core_only:
        # mlflow: the MLflow client the train/evaluate/promote tasks use when a pipeline has an mlflow_conn_id.
        wanted += list(extras["airflow"]) + list(extras["mlflow"])
    return [r for r in wanted if name(r) not in EXCLUDED]


if __name__ == "__main__":
    args = sys.argv[1:]
    core_only = "--core" in args
    paths = [a for a in args if a != "--core"]
    with open(paths[0] if paths else "pyproject.toml", "rb") as f:
        print("\n".join(requirements(tomllib.load(f), core_only)))

"""The package boundaries the layout promises: training/ (the engine and the platform core: runs, registry,
backends) never imports Airflow or the Airflow adapters (ringflow.operators); the core and operators/ never
import torch or horovod at import time; everything installs under the `ringflow` namespace only."""
import pkgutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import ringflow.operators
import ringflow.training
import ringflow.training.backends
import ringflow.training.registry
import ringflow.training.runs

ROOT = Path(__file__).resolve().parents[1]


def modules(package) -> list[str]:
    return [m.name for m in pkgutil.walk_packages(package.__path__, package.__name__ + ".")]


def imported_after(names: list[str], forbidden: tuple[str, ...]) -> list[str]:
    code = ("import importlib, sys\n"
            f"for name in {names!r}: importlib.import_module(name)\n"
            f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({forbidden!r})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return eval(out.stdout.strip().splitlines()[-1])


def test_training_never_imports_airflow():
    assert imported_after(modules(ringflow.training), ("airflow",)) == []


def test_training_never_imports_the_airflow_adapters():
    code = ("import importlib, sys\n"
            f"for name in {modules(ringflow.training)!r}: importlib.import_module(name)\n"
            "print(sorted(m for m in sys.modules if m.startswith('ringflow.operators')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"


CORE = (ringflow.training.runs, ringflow.training.registry, ringflow.training.backends)


@pytest.mark.parametrize("package", CORE, ids=lambda p: p.__name__)
def test_the_core_never_imports_airflow_torch_or_horovod_at_import_time(package):
    """The CLI and the operators both use the core: it must import without either side's heavy stack."""
    assert imported_after(modules(package), ("airflow", "torch", "horovod")) == []


def test_operators_never_import_torch_or_horovod_at_import_time():
    assert imported_after(modules(ringflow.operators), ("torch", "horovod")) == []


@pytest.mark.slow
def test_wheel_installs_only_under_ringflow(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", str(ROOT), "-w", str(tmp_path)],
                   check=True, capture_output=True, timeout=600)
    (wheel,) = tmp_path.glob("ringflow-*.whl")
    tops = {name.split("/")[0] for name in zipfile.ZipFile(wheel).namelist()}
    assert tops == {"ringflow", wheel.name.split("-")[0] + "-" + wheel.name.split("-")[1] + ".dist-info"}
    names = zipfile.ZipFile(wheel).namelist()
    assert "ringflow/training/worker.py" in names and "ringflow/operators/train.py" in names
    assert "ringflow/training/backends/kubernetes/backend.py" in names
    assert {"ringflow/training/runs/store_layout.py", "ringflow/training/registry/model_registry.py"} <= set(names)


def test_mlflow_is_imported_only_when_a_pipeline_is_given_an_mlflow_connection():
    """MLflow is optional: the operators, the tracking package and a DAG built with the pipeline factory (no
    mlflow_conn_id) never import it."""
    import ringflow.training.tracking

    names = modules(ringflow.operators) + modules(ringflow.training.tracking)
    assert imported_after(names, ("mlflow",)) == []
    code = ("import sys\n"
            "from airflow.sdk import DAG\n"
            "from ringflow.operators.pipeline import ringflow_pipeline\n"
            "with DAG('no_mlflow', schedule=None):\n"
            "    ringflow_pipeline('digits', dataset_uri='builtin:digits', model_name='m', store_uri='/tmp/s',\n"
            "                      epochs=1, batch_size=32, learning_rate=0.01)\n"
            "print('mlflow' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "False"


def test_parsing_a_dag_loads_no_data_stack():
    """The scheduler parses DAG files over and over: the pipeline factory must not load pandas, numpy, pyarrow
    or Great Expectations (the validate operator imports the core's engine when its task runs)."""
    assert imported_after(["ringflow.operators.pipeline", "ringflow.operators.sweep"],
                          ("pandas", "numpy", "pyarrow", "great_expectations")) == []

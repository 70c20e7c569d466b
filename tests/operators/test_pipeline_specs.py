"""The pipeline factory's typed groups (pipeline_specs.py): each refuses a wrong value when it is built, naming
the field and the fix, and takes a template wherever the DAG passes a Param."""
import datetime as dt

import pytest

from ringflow.operators.pipeline_specs import DataSpec, GateSpec, TrackingSpec, TrainingSpec
from ringflow.training.formats.config import ConfigError
from ringflow.training.core.tracking.settings import TrackingConfigError

TRAINING = dict(epochs=2, batch_size=8, learning_rate=0.01)


@pytest.mark.parametrize("build, error, says", [
    (lambda: DataSpec(""), ValueError, "DataSpec.dataset_uri is ''; give 'builtin:<name>'"),
    (lambda: DataSpec("builtin:wine", suite=3), ValueError, "DataSpec.suite is a int"),
    (lambda: DataSpec("builtin:wine", target=""), ValueError, "DataSpec.target is ''; name the label column"),
    (lambda: DataSpec("builtin:wine", seed=-1), ValueError, "DataSpec.seed is -1; give a whole number >= 0"),
    (lambda: DataSpec("builtin:wine", eval_fraction=1.0), ValueError, "DataSpec.eval_fraction is 1.0; .* >= 0 and < 1"),
    (lambda: TrainingSpec(**TRAINING | {"epochs": 0}), ValueError, "TrainingSpec.epochs is 0; give a whole number >= 1"),
    (lambda: TrainingSpec(**TRAINING | {"batch_size": 2.5}), ValueError, "TrainingSpec.batch_size is 2.5"),
    (lambda: TrainingSpec(**TRAINING | {"learning_rate": 0}), ValueError, "TrainingSpec.learning_rate is 0; .* > 0"),
    (lambda: TrainingSpec(**TRAINING | {"learning_rate": float("nan")}), ValueError, "learning_rate is nan"),
    (lambda: TrainingSpec(**TRAINING, num_workers=True), ValueError, "TrainingSpec.num_workers is True"),
    (lambda: TrainingSpec(**TRAINING, engine="deepspeed"), ValueError, "TrainingSpec.engine is 'deepspeed'"),
    (lambda: TrainingSpec(**TRAINING, job_config={"run_uri": "/x"}), ConfigError, "cannot be overridden"),
    (lambda: TrainingSpec(**TRAINING, job_config="epochs: 3"), ValueError, "TrainingSpec.job_config is 'epochs: 3'"),
    (lambda: TrainingSpec(**TRAINING, controller="nccl"), ValueError, "TrainingSpec.controller is 'nccl'"),
    (lambda: TrainingSpec(**TRAINING, retries=-1), ValueError, "TrainingSpec.retries is -1"),
    (lambda: TrainingSpec(**TRAINING, retry_delay=30), ValueError, "TrainingSpec.retry_delay is 30"),
    (lambda: TrainingSpec(**TRAINING, job_timeout=dt.timedelta(0)), ValueError, "TrainingSpec.job_timeout is"),
    (lambda: GateSpec(mode="best"), ValueError, "gate mode is 'best'"),
    (lambda: GateSpec(threshold="high"), ValueError, "gate threshold rendered to 'high'"),
    (lambda: GateSpec(metric=""), ValueError, "gate metric is ''"),
    (lambda: GateSpec(fail_on_gate="yes"), ValueError, "GateSpec.fail_on_gate is 'yes'; use True or False"),
    (lambda: GateSpec(approval_timeout=dt.timedelta(0)), ValueError, "approval_timeout is"),
    (lambda: GateSpec(approvers="alice"), ValueError, "GateSpec.approvers is 'alice'; give a list of user ids"),
    (lambda: TrackingSpec(mlflow_conn_id=""), ValueError, "TrackingSpec.mlflow_conn_id is ''"),
    (lambda: TrackingSpec(alias="latest"), TrackingConfigError, "MLflow alias is 'latest'"),
])
def test_a_wrong_value_is_refused_when_the_spec_is_built(build, error, says):
    with pytest.raises(error, match=says):
        build()


@pytest.mark.parametrize("build", [
    lambda: DataSpec("{{ params.dataset_uri }}", seed="{{ params.seed }}", eval_fraction="{{ params.fraction }}"),
    lambda: TrainingSpec(epochs="{{ params.epochs }}", batch_size="{{ params.batch_size }}",
                         learning_rate="{{ params.learning_rate }}", num_workers="{{ params.num_workers }}",
                         engine="{{ params.engine }}", job_config="{{ params.job_overrides }}"),
    lambda: GateSpec(metric="{{ params.gate_metric }}", mode="{{ params.gate_mode }}",
                     threshold="{{ params.gate_threshold }}"),
])
def test_templates_are_taken_and_checked_when_the_task_renders_them(build):
    build()  # no error: the operator checks the rendered value


def test_the_defaults_are_a_valid_pipeline():
    assert GateSpec().metric == "accuracy" and GateSpec().require_approval is False
    assert TrackingSpec().mlflow_conn_id is None
    assert DataSpec("builtin:digits").target == "target"
    assert TrainingSpec(**TRAINING).retries == 1
    with pytest.raises(dataclasses_frozen_error()):
        TrainingSpec(**TRAINING).epochs = 3  # frozen: one group shared by several pipelines stays as built


def dataclasses_frozen_error():
    import dataclasses

    return dataclasses.FrozenInstanceError


@pytest.mark.parametrize("entry, scripts_dir, says", [
    ({"script": "train.py", "folder": "nope"}, "SCRIPTS", "script 'nope' is not one of the scripts in .*: pick one"),
    ({"script": "train.py", "folder": "../ddp_digits"}, "SCRIPTS", "not one of the scripts"),
    ({"script": "train.py", "folder": "x", "bundle_sha256": "ab" * 32}, None, "TrainingSpec.entry is .* the launch pins"),
    ({"folder": "x"}, None, r"TrainingSpec.entry is .*\(script required"),
    ("train.py", None, "TrainingSpec.entry is 'train.py'"),
    ({"script": "train.sh", "folder": "x"}, None, "config field 'entry.script'"),
    ({"script": "train.py", "args": "--fast"}, None, "config field 'entry.args'"),
    (None, "SCRIPTS", "TrainingSpec.scripts_dir is .* with an entry whose folder names one of them"),
])
def test_a_wrong_entry_is_refused_when_the_spec_is_built(tmp_path, entry, scripts_dir, says):
    (tmp_path / "ddp_digits").mkdir()
    (tmp_path / "ddp_digits" / "train.py").write_text("")
    with pytest.raises(ValueError, match=says):
        TrainingSpec(**TRAINING, entry=entry, scripts_dir=str(tmp_path) if scripts_dir else None)


def test_an_entry_from_the_scripts_dir_or_a_template_is_taken(tmp_path):
    (tmp_path / "ddp_digits").mkdir()
    (tmp_path / "ddp_digits" / "train.py").write_text("")
    picked = TrainingSpec(**TRAINING, entry={"script": "train.py", "folder": "ddp_digits", "args": ["--fast"]},
                          scripts_dir=str(tmp_path))
    assert picked.entry["folder"] == "ddp_digits"
    TrainingSpec(**TRAINING, entry={"script": "train.py", "folder": "{{ params.script }}",
                                    "args": "{{ params.script_args }}"}, scripts_dir=str(tmp_path))

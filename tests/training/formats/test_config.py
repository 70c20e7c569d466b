import json

import pytest

from ringflow.training.formats.config import ConfigError, JobConfig, load_job_config


def valid() -> dict:
    return {"manifest_uri": "/data/shards/manifest.json", "run_uri": "/data/run"}


def test_skip_rows_are_typed_rows_and_survive_the_round_trip():
    from ringflow.training.formats.config import RowRef

    cfg = JobConfig.from_dict(valid() | {"skip_rows": [{"file": "part-00001.parquet", "row": 7}]})
    assert cfg.skip_rows == (RowRef("part-00001.parquet", 7),) and JobConfig.from_dict(cfg.to_dict()) == cfg


def test_minimal_config_gets_defaults():
    cfg = JobConfig.from_dict(valid())
    assert cfg.epochs == 5 and cfg.model.kind == "mlp" and cfg.horovod.backward_passes_per_step == 1
    assert JobConfig.from_dict(cfg.to_dict()) == cfg


@pytest.mark.parametrize("change, field, hint", [
    (lambda d: d.pop("manifest_uri"), "manifest_uri", "is missing"),
    (lambda d: d.pop("run_uri"), "run_uri", "is missing"),
    (lambda d: d.update(run_uri=""), "run_uri", "s3://bucket/prefix"),
    (lambda d: d.update(checkpoint={"uri": "/data/run"}), "checkpoint.uri", "not a known field"),
    (lambda d: d.update(batch_size=-4), "batch_size", ">= 1"),
    (lambda d: d.update(batch_size=True), "batch_size", ">= 1"),
    (lambda d: d.update(epochs="3"), "epochs", ">= 1"),
    (lambda d: d.update(learning_rate=0), "learning_rate", "> 0"),
    (lambda d: d.update(optimizer="lion"), "optimizer", "one of"),
    (lambda d: d.update(bogus=1), "bogus", "not a known field"),
    (lambda d: d.update(model={"kind": "custom", "factory": "no colon"}), "model.factory", "import path"),
    (lambda d: d.update(model={"hidden": [64, 0]}), "model.hidden", "positive"),
    (lambda d: d.update(health={"straggler_ratio": 0.5}), "health.straggler_ratio", "> 1"),
    (lambda d: d.update(health={"max_sync_share": 1.5}), "health.max_sync_share", "(0, 1]"),
    (lambda d: d.update(horovod={"backward_passes_per_step": 0}), "horovod.backward_passes_per_step", ">= 1"),
    (lambda d: d.update(horovod={"fp16_compression": "yes"}), "horovod.fp16_compression", "true or false"),
    (lambda d: d.update(horovod={"mpi_yield_when_idle": 1}), "horovod.mpi_yield_when_idle", "true or false"),
    (lambda d: d.update(health={"enabled": "no"}), "health.enabled", "true or false"),
    (lambda d: d.update(checkpoint={"every_steps": 0}), "checkpoint.every_steps", ">= 1"),
    (lambda d: d.update(faults=[{"kind": "meteor"}]), "faults[].kind", "one of"),
    (lambda d: d.update(manifest_uri="/data/shards"), "manifest_uri", "manifest.json"),
    (lambda d: d.update(bind_cores="yes"), "bind_cores", 'use "auto"'),
    (lambda d: d.update(bind_cores="true"), "bind_cores", "true (bind wherever every rank can have a CPU)"),
    (lambda d: d.update(bind_cores=1), "bind_cores", "or false (never bind)"),
    (lambda d: d.update(skip_rows={"file": "part-00001.parquet", "row": 3}), "skip_rows", "give a list"),
    (lambda d: d.update(skip_rows=[{"file": "", "row": 3}]), "skip_rows[].file", "evidence.replay.rows"),
    (lambda d: d.update(skip_rows=[{"file": "part-00001.parquet", "row": -1}]), "skip_rows[].row", ">= 0"),
    (lambda d: d.update(skip_rows=[{"file": "part-00001.parquet"}]), "skip_rows[].row", "is missing"),
    (lambda d: d.update(skip_rows=[{"file": "p.parquet", "row": 3}, {"file": "p.parquet", "row": 3}]), "skip_rows",
     "list each row once"),
    (lambda d: d.update(health={"replay_seconds": -1}), "health.replay_seconds", ">= 0"),
])
def test_bad_values_name_the_field_and_the_fix(change, field, hint):
    doc = valid()
    change(doc)
    with pytest.raises(ConfigError) as err:
        JobConfig.from_dict(doc)
    assert err.value.field == field
    assert field in str(err.value) and hint in str(err.value)


@pytest.mark.parametrize("value", ["auto", True, False])
def test_bind_cores_choices(value):
    assert JobConfig.from_dict(valid() | {"bind_cores": value}).bind_cores == value
    assert JobConfig.from_dict(valid()).bind_cores == "auto"


def test_load_from_file_and_bad_json(tmp_path):
    path = tmp_path / "job.json"
    path.write_text(json.dumps(valid()))
    assert load_job_config(str(path)).manifest_uri.endswith("manifest.json")
    assert load_job_config(f"file://{path}").run_uri == "/data/run"
    path.write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_job_config(str(path))
    with pytest.raises(ConfigError, match="cannot read"):
        load_job_config(str(tmp_path / "missing.json"))


def test_horovod_knobs_become_environment():
    cfg = JobConfig.from_dict(valid() | {"horovod": {"fusion_threshold_mb": 1, "cycle_time_ms": 2.5}})
    assert cfg.horovod.environment() == {"HOROVOD_FUSION_THRESHOLD": str(1024 * 1024), "HOROVOD_CYCLE_TIME": "2.5",
                                         "OMPI_MCA_mpi_yield_when_idle": "1"}
    # Off leaves Open MPI's own choice (yield only when oversubscribed) rather than forcing busy polling.
    off = JobConfig.from_dict(valid() | {"horovod": {"mpi_yield_when_idle": False}})
    assert "OMPI_MCA_mpi_yield_when_idle" not in off.horovod.environment()


@pytest.mark.parametrize("section, cadence, floor", [
    ({}, 50, 30.0),                                                  # the default: every 50 steps, >= 30 s apart
    ({"every_steps": 20}, 20, 0.0),                                  # your every_steps: exactly those steps
    ({"min_interval_seconds": 5}, 50, 5.0),
    ({"every_steps": 20, "min_interval_seconds": 60}, 20, 60.0),
    ({"min_interval_seconds": 0}, 50, 0.0),
])
def test_the_checkpoint_cadence_and_its_time_floor(section, cadence, floor):
    from ringflow.training.formats.config import CheckpointConfig

    cfg = CheckpointConfig(**section)
    assert (cfg.cadence_steps, cfg.floor_seconds) == (cadence, floor)


@pytest.mark.parametrize("section, field", [
    ({"every_steps": 0}, "checkpoint.every_steps"),
    ({"min_interval_seconds": -1}, "checkpoint.min_interval_seconds"),
    ({"min_interval_seconds": "soon"}, "checkpoint.min_interval_seconds"),
])
def test_a_bad_checkpoint_cadence_names_its_field(section, field):
    from ringflow.training.formats.config import CheckpointConfig, ConfigError

    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        CheckpointConfig(**section)


def test_a_fault_names_its_try_and_an_oom_fault_its_batch():
    cfg = JobConfig.from_dict(valid() | {"faults": [{"kind": "oom", "rank": 0, "step": 2, "above_batch": 16, "on_try": 2}]})
    (fault,) = cfg.faults
    assert (fault.kind, fault.on_try, fault.above_batch) == ("oom", 2, 16)
    assert JobConfig.from_dict(valid() | {"faults": [{"kind": "crash"}]}).faults[0].on_try == 1
    for bad, field in (({"kind": "crash", "on_try": 0}, "faults[].on_try"),
                       ({"kind": "oom", "above_batch": -1}, "faults[].above_batch")):
        with pytest.raises(ConfigError) as err:
            JobConfig.from_dict(valid() | {"faults": [bad]})
        assert err.value.field == field


def test_what_a_remedy_sets_is_checked_like_the_rest():
    applied = {"try": 2, "verdict": "OOM", "remedy": "smaller_batch", "words": "out of memory"}
    cfg = JobConfig.from_dict(valid() | {"resume_before_step": 40, "remedies": [applied]})
    assert cfg.resume_before_step == 40 and cfg.remedies == (applied,)
    assert JobConfig.from_dict(cfg.to_dict()) == cfg
    for bad, field in (({"resume_before_step": 0}, "resume_before_step"),
                       ({"remedies": [{"remedy": "x"}]}, "remedies[]"),
                       ({"remedies": "lower_learning_rate"}, "remedies")):
        with pytest.raises(ConfigError) as err:
            JobConfig.from_dict(valid() | bad)
        assert err.value.field == field

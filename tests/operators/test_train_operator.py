"""The train operator: builds a checked config, launches through the backend, defers; on_kill stops the job."""
import json
import types

import pytest
from airflow.sdk.exceptions import AirflowException, AirflowFailException, TaskDeferred

from ringflow.operators.train import (
    OWNED_FIELDS, TrainOperator, build_job_config, job_name, merge, owned_fields_in, worker_count,
)
from ringflow.operators.trigger import TrainJobTrigger
from ringflow.training.core.backends.local import LocalProcessBackend
from ringflow.training.formats.config import ConfigError
from ringflow.training.core.runs import store_layout


def context(try_number=1):
    return {"ti": types.SimpleNamespace(dag_id="ringflow_retrain", run_id="manual__2026-11-30T00:00:00+00:00",
                                        task_id="train", try_number=try_number)}


def operator(tmp_path, manifest, **kwargs):
    return TrainOperator(task_id="train", manifest_uri=manifest, run_uri=str(tmp_path / "run"),
                         backend=LocalProcessBackend(work_dir=str(tmp_path / "jobs"), stop_grace_seconds=2),
                         **kwargs)


def test_job_names_are_dns_labels_unique_per_try():
    a = job_name("My_DAG", "manual__2026-11-30T00:00:00+00:00", "train", 1)
    assert a.startswith("rf-my-dag-train-") and a.endswith("-t1") and len(a) <= 63
    assert job_name("My_DAG", "manual__2026-11-30T00:00:00+00:00", "train", 2) != a
    assert job_name("x" * 300, "r", "t", 1).count("-") >= 2 and len(job_name("x" * 300, "r", "t", 1)) <= 63


def test_merge_is_deep():
    assert merge({"a": {"b": 1, "c": 2}, "d": 1}, {"a": {"c": 3}}) == {"a": {"b": 1, "c": 3}, "d": 1}


def test_bad_config_fails_before_launch(tmp_path, digits_manifest):
    op = operator(tmp_path, digits_manifest, job_config={"batch_size": 0})
    with pytest.raises(AirflowFailException, match="batch_size") as err:  # no retry: it would fail the same way
        op.execute(context())
    assert isinstance(err.value.__cause__, ConfigError)
    assert not (tmp_path / "jobs").exists()


@pytest.mark.parametrize("job_config, num_workers, says", [
    ({"batch_size": 500}, 3, "3 workers x 500 rows exceeds the shards' 1408 training rows"),
    ({"model": {"kind": "custom", "factory": "no_such_module_xyz:build"}}, 2, "cannot be imported"),
])
def test_preflight_fails_before_launch(tmp_path, digits_manifest, job_config, num_workers, says):
    op = operator(tmp_path, digits_manifest, num_workers=num_workers, job_config=job_config)
    with pytest.raises(AirflowFailException, match=says):
        op.execute(context())
    assert not (tmp_path / "jobs").exists()


def test_an_unknown_engine_fails_in_execute_before_launch(tmp_path, digits_manifest):
    op = operator(tmp_path, digits_manifest, engine="{{ params.engine }}")
    assert "engine" in op.template_fields
    op.engine = "horovd"  # what the template rendered to
    with pytest.raises(AirflowFailException, match="engine.*'horovd'.*\"horovod\".*\"ddp\"") as err:
        op.execute(context())
    assert err.value.__cause__.field == "engine"
    assert not (tmp_path / "jobs").exists()


def test_preflight_runs_for_mpijobs_too(tmp_path, digits_manifest):
    """The same check before an MPIJob is submitted: nothing reaches the cluster."""
    from ringflow.operators.connections import AirflowConnections
    from ringflow.training.core.backends.kubernetes.mpijob_backend import MPIJobBackend

    backend = MPIJobBackend({"image": "registry/ringflow-training:0.1.0"}, kubeconfig_path="/nonexistent",
                            connections=AirflowConnections())  # kept as is: the operator rebuilds one without
    backend.client = None  # any API call would fail with AttributeError, not the preflight's message
    op = TrainOperator(task_id="train", manifest_uri=digits_manifest, run_uri=str(tmp_path / "run"),
                       num_workers=3, backend=backend, batch_size=500)
    with pytest.raises(AirflowFailException, match="3 workers x 500 rows exceeds"):
        op.execute(context())
    # The factory is the image's to check (its ranks do, at start): the Airflow worker may not have it.
    op = TrainOperator(task_id="train", manifest_uri=digits_manifest, run_uri=str(tmp_path / "run"),
                       backend=backend, job_config={"model": {"kind": "custom", "factory": "in_image:build"}})
    with pytest.raises(AttributeError):  # past the preflight: on to find() on the cluster
        op.execute(context())


@pytest.mark.job
def test_defers_reattaches_and_on_kill_stops_the_job(tmp_path, digits_manifest):
    op = operator(tmp_path, digits_manifest, job_config={"faults": [{"kind": "hang", "rank": 0, "step": 1}]})
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(context())
    trigger = deferred.value.trigger
    assert isinstance(trigger, TrainJobTrigger) and deferred.value.method_name == "execute_complete"
    job_id = trigger.job_id
    assert trigger.attempt == job_id  # the job's attempt id: the trigger takes this job's result only
    backend = op.backend
    assert backend.status(job_id).state == "running"

    retry = operator(tmp_path, digits_manifest)
    with pytest.raises(TaskDeferred) as again:
        retry.execute(context(try_number=2))
    assert again.value.trigger.job_id == job_id  # reattached, not a second job

    op.on_kill()
    assert backend.status(job_id).finished


def finished_event(state="failed", result=None, verdict=None, job_id="rf-1"):
    """What the trigger reports for a finished job (TrainJobTrigger.event), as the triggerer stores it."""
    from ringflow.training.core.failure_policy import Observation

    seen = Observation(state, 0 if state == "succeeded" else 1, "" if state == "succeeded" else "the job failed",
                       result, job_id, verdict, fatal=verdict is not None and verdict.is_fatal())
    return json.loads(json.dumps(TrainJobTrigger.event(job_id, seen)))


def test_execute_complete_turns_errors_into_failures(tmp_path, digits_manifest):
    from ringflow.training.health.verdict import Verdict

    op = operator(tmp_path, digits_manifest)
    nan = finished_event(verdict=Verdict("NONFINITE", "NaN/Inf in rank(s) [1]", {"step": 4, "ranks": [1]}))
    with pytest.raises(AirflowFailException, match=r"NONFINITE.*evidence.*\"ranks\": \[1\]"):
        op.execute_complete(context(), nan)  # not retried: a retry would meet the same NaN
    stalled = finished_event(verdict=Verdict("STALLED", "no step", {"rank": 1}))
    with pytest.raises(AirflowException) as err:
        op.execute_complete(context(), stalled)
    assert not isinstance(err.value, AirflowFailException)  # a hang may pass: retry from the checkpoint


def test_an_engine_the_backend_cannot_run_fails_without_retry_before_launch(tmp_path, digits_manifest):
    """Checked once when the task starts: before, an MPIJob backend refused DDP only in launch(), outside the
    no-retry block, so the task was retried into the same refusal."""
    from ringflow.operators.connections import AirflowConnections
    from ringflow.training.core.backends.kubernetes.mpijob_backend import MPIJobBackend

    backend = MPIJobBackend({"image": "registry/ringflow-training:0.1.0"}, kubeconfig_path="/nonexistent",
                            connections=AirflowConnections())
    backend.client = None  # any API call (find, launch) would fail with AttributeError
    op = TrainOperator(task_id="train", manifest_uri=digits_manifest, run_uri=str(tmp_path / "run"),
                       engine="ddp", backend=backend)
    with pytest.raises(AirflowFailException, match="engine 'ddp' cannot run as an MPIJob.*TrainJob"):
        op.execute(context())


def test_execute_complete_returns_the_jobs_own_result(tmp_path, digits_manifest, capsys):
    from ringflow.training.health.verdict import Verdict
    from ringflow.training.formats.run_result import RunResult

    op = operator(tmp_path, digits_manifest)
    left = {"why": "left", "detail": "Horovod has been shut down", "from_world_size": 3, "to_world_size": 2,
            "commit_step": 10, "steps_redone": 2, "failed_at": 100.0, "resumed_at": 100.5, "rank0_changed": True,
            "recovery_seconds": 0.5}
    result = RunResult(status="succeeded", attempt="rf-1", step=44, epoch=2, world_size=2, checkpoint="ckpt-000000044",
                       verdict=Verdict("HEALTHY", "no sign of trouble", {"steps_measured": 44}), loss=float("nan"),
                       membership_changes=(left,))
    out = op.execute_complete(context(), finished_event("succeeded", result))
    # an elastic job's changes of workers are in the task log's summary
    assert "workers changed 1x: 3→2 left (back to step 10, 2 redone, new rank 0, 0.50s)" in capsys.readouterr().out
    assert (out["checkpoint"], out["step"], out["status"], out["loss"]) == ("ckpt-000000044", 44, "succeeded", "nan")
    assert out["verdict"]["status"] == "HEALTHY" and out["job_id"] == "rf-1"
    json.dumps(out, allow_nan=False)  # an XCom in strict JSON
    with pytest.raises(AirflowException, match="wrote no result.json for attempt rf-1"):
        op.execute_complete(context(), finished_event("succeeded"))


def test_execute_complete_logs_the_health_summary(tmp_path, digits_manifest, capsys):
    from ringflow.training.health.verdict import Verdict

    op = operator(tmp_path, digits_manifest)
    nan = finished_event(verdict=Verdict("NONFINITE", "NaN/Inf in rank(s) [1] at step 4", {"step": 4}))
    with pytest.raises(AirflowFailException):
        op.execute_complete(context(), nan)
    said = capsys.readouterr().out  # the task logger (structlog) writes to stdout here
    summary = said[said.index("── health summary ──"):]
    assert "verdict: NONFINITE: NaN/Inf in rank(s) [1] at step 4" in summary
    assert "result: none written by this attempt" in summary


def test_a_run_folder_whose_health_records_cannot_be_read_is_still_handed_on(tmp_path, digits_manifest):
    from ringflow.training.formats.run_layout import HEALTH

    op = operator(tmp_path, digits_manifest)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / HEALTH).symlink_to(HEALTH)  # a link to itself: reading it fails (ELOOP), not "missing"
    run, records = op._read_run_folder()
    assert records is None and run is not None and run.uri.rstrip("/").endswith("/run")
    bad = operator(tmp_path, digits_manifest)
    bad.run_uri = "nosuchscheme://bucket/run"
    assert bad._read_run_folder() == (None, None)


@pytest.mark.parametrize("overrides, field", [
    ({"manifest_uri": "s3://other-team/shards/manifest.json"}, "manifest_uri"),
    ({"run_uri": "s3://other-team/runs/x", "checkpoint": {"every_steps": 10}}, "run_uri"),
    ({"epochs": 2, "manifest_uri": "/m.json", "run_uri": "/r"}, "manifest_uri"),
])
def test_overrides_cannot_change_where_a_run_reads_or_writes(tmp_path, digits_manifest, overrides, field):
    # A plain dict is refused when the operator is made (the DAG fails to parse, naming the field)...
    with pytest.raises(ConfigError, match=rf"config field '{field}': cannot be overridden") as err:
        operator(tmp_path, digits_manifest, job_config=overrides)
    assert err.value.field == field
    # ... and a template (a DAG Param) when it has rendered, before anything is launched.
    op = operator(tmp_path, digits_manifest, job_config="{{ params.job_overrides | tojson }}")
    op.job_config = json.dumps(overrides)  # what rendering gives
    with pytest.raises(AirflowFailException, match=rf"config field '{field}'"):
        op.execute(context())
    assert not (tmp_path / "jobs").exists()


def test_overrides_may_change_how_it_trains(tmp_path, digits_manifest):
    op = operator(tmp_path, digits_manifest, job_config={"checkpoint": {"every_steps": 7}, "epochs": 2})
    config = op.build_config(str(tmp_path / "run"))
    assert config["run_uri"] == str(tmp_path / "run") and config["checkpoint"]["every_steps"] == 7
    assert config["manifest_uri"] == digits_manifest and config["epochs"] == 2
    assert owned_fields_in({"checkpoint": {"keep_last": 2}, "health": {"uri": "x"}}) == []
    everything = {"manifest_uri": "a", "run_uri": "b", "resume_before_step": 3, "remedies": [],
                  "entry": {"script": "train.py"}}
    assert owned_fields_in(everything) == list(OWNED_FIELDS)


@pytest.mark.parametrize("field, value", [("resume_before_step", 10), ("remedies", [])])
def test_the_retrys_remediation_fields_cannot_be_set_by_hand(field, value):
    from ringflow.training.formats.config import ConfigError

    with pytest.raises(ConfigError, match=rf"config field '{field}'.*remediation.*remove '{field}'"):
        build_job_config(manifest_uri="m/manifest.json", run_uri="r", overrides={field: value})


FAULT = {"kind": "crash", "rank": 1, "step": 7}
FAULT_DEFAULTS = {"seconds": 0.0, "on_try": 1, "above_batch": 0}


@pytest.mark.parametrize("args, try_number, expect", [
    # epochs, batch size and learning rate, then the overrides on top
    ({"epochs": 3, "batch_size": 32, "learning_rate": 0.01, "overrides": {"seed": 4}}, 1,
     {"epochs": 3, "batch_size": 32, "learning_rate": 0.01, "seed": 4, "faults": []}),
    ({"epochs": 3, "overrides": {"epochs": 9}}, 1, {"epochs": 9}),
    # what templates render to without native rendering: text, and a dict's Python literal
    ({"epochs": "3", "batch_size": "16", "learning_rate": "0.5", "overrides": "{'checkpoint': {'every_steps': 10}}"},
     1, {"epochs": 3, "batch_size": 16, "learning_rate": 0.5, "checkpoint": {"every_steps": 10}}),
    ({"overrides": '{"seed": 2}'}, 1, {"seed": 2}),
    ({"overrides": "{}", "epochs": None}, 1, {"epochs": 5}),  # None: the config's default
    # injected faults on the try they name, the first by default: a retry resumes and shows the recovery, or
    # meets the next fault of a chain
    ({"overrides": {"faults": [FAULT], "seed": 4}}, 1, {"faults": [FAULT | FAULT_DEFAULTS], "seed": 4}),
    ({"overrides": {"faults": [FAULT], "seed": 4}}, 2, {"faults": [], "seed": 4}),
    ({"overrides": {"faults": [FAULT, FAULT | {"on_try": 2, "step": 3}, FAULT | {"on_try": 3}]}}, 2,
     {"faults": [FAULT | FAULT_DEFAULTS | {"on_try": 2, "step": 3}]}),
    # the engine: the config's default, the argument (text from a template), or the overrides on top
    ({}, 1, {"engine": "horovod"}),
    ({"engine": "ddp"}, 1, {"engine": "ddp"}),
    ({"engine": " ddp "}, 1, {"engine": "ddp"}),
    ({"engine": "None"}, 1, {"engine": "horovod"}),
    ({"engine": "ddp", "overrides": {"engine": "horovod"}}, 1, {"engine": "horovod"}),
])
def test_build_job_config(args, try_number, expect):
    config = build_job_config(manifest_uri="/s/manifest.json", run_uri="/r", try_number=try_number, **args)
    assert config["manifest_uri"] == "/s/manifest.json" and config["run_uri"] == "/r"
    for key, value in expect.items():
        if isinstance(value, dict):
            assert {k: config[key][k] for k in value} == value, key
        else:
            assert config[key] == value, key


@pytest.mark.parametrize("args, field, says", [
    ({"epochs": "five"}, "epochs", "rendered to 'five'; give a whole number"),
    ({"epochs": 2.5}, "epochs", "give a whole number"),
    ({"learning_rate": "fast"}, "learning_rate", "give a number"),
    ({"overrides": "epochs: 3"}, "job_config", "neither JSON nor a Python dict"),
    ({"overrides": "[1, 2]"}, "job_config", "is list"),
    ({"overrides": '{"run_uri": "/elsewhere"}'}, "run_uri", "cannot be overridden"),
    ({"overrides": '{"checkpoint": {"uri": "/elsewhere"}}'}, "checkpoint.uri", "not a known field"),
    ({"batch_size": "0"}, "batch_size", ">= 1"),
    ({"engine": "deepspeed"}, "engine", "is 'deepspeed'; use \"horovod\" .* or \"ddp\""),
])
def test_rendered_values_are_checked(args, field, says):
    with pytest.raises(ConfigError, match=says) as err:
        build_job_config(manifest_uri="/s/manifest.json", run_uri="/r", **args)
    assert err.value.field == field


@pytest.mark.parametrize("value, expect", [(2, 2), ("2", 2), (" 16 ", 16), ("0", None), ("two", None),
                                           (True, None), ("1.5", None)])
def test_worker_count(value, expect):
    if expect is None:
        with pytest.raises(ValueError, match="num_workers is .*give a whole number >= 1"):
            worker_count(value)
    else:
        assert worker_count(value) == expect


def test_run_folder_comes_from_the_store_the_dag_run_and_the_task_group(tmp_path):
    """The same folder for every try (retries resume); each TaskGroup of a DAG has its own."""
    import datetime as dt

    from airflow.sdk import DAG, TaskGroup

    with DAG("two", schedule=None, start_date=dt.datetime(2025, 1, 1)):
        with TaskGroup("digits"):
            grouped = TrainOperator(task_id="train", manifest_uri="/m.json", store_uri="s3://b/ml")
        alone = TrainOperator(task_id="train", manifest_uri="/m.json", store_uri="s3://b/ml")
        given = TrainOperator(task_id="given", manifest_uri="/m.json", run_uri="/runs/mine")
    run_id = "manual__2026-11-30T00:00:00+00:00"
    folders = {grouped.run_folder(context(try_number=n)) for n in (1, 2, 3)}
    assert folders == {store_layout.run_uri("s3://b/ml", "ringflow_retrain", run_id, "digits")}
    assert folders == {"s3://b/ml/runs/ringflow_retrain/manual__2026-11-30T00_00_00_00_00/digits"}
    assert alone.run_folder(context()) == "s3://b/ml/runs/ringflow_retrain/manual__2026-11-30T00_00_00_00_00"
    assert given.run_folder(context()) == "/runs/mine"
    with pytest.raises(ValueError, match="give run_uri .* or store_uri"):
        TrainOperator(task_id="neither", manifest_uri="/m.json")


class RecordingBackend(LocalProcessBackend):
    """The local backend that starts nothing: it keeps the job spec each launch was handed (its connections
    given, so the operator keeps it instead of building the real one)."""

    def __init__(self, **kwargs):
        from ringflow.operators.connections import AirflowConnections

        super().__init__(connections=AirflowConnections(), **kwargs)
        self.launched = []

    def find(self, labels):
        return None

    def launch(self, spec):
        self.launched.append(spec)
        return spec.name


def scripts(tmp_path):
    """A scripts folder with one script folder, ddp_digits, holding train.py."""
    folder = tmp_path / "scripts" / "ddp_digits"
    folder.mkdir(parents=True)
    (folder / "train.py").write_text("print('training')\n")
    return tmp_path / "scripts"


def test_a_script_is_pinned_into_the_run_folder_and_the_backend_gets_its_sha256_never_the_folder(
        tmp_path, digits_manifest):
    backend = RecordingBackend(work_dir=str(tmp_path / "jobs"))
    op = TrainOperator(task_id="train", manifest_uri=digits_manifest, run_uri=str(tmp_path / "run"), backend=backend,
                       engine="ddp", scripts_dir=str(scripts(tmp_path)),
                       entry={"script": "train.py", "folder": "ddp_digits", "args": "['--epochs', '2']"})
    with pytest.raises(TaskDeferred):
        op.execute(context())

    [spec] = backend.launched
    entry = spec.config["entry"]
    assert entry["folder"] is None and entry["script"] == "train.py" and entry["args"] == ["--epochs", "2"]
    assert (tmp_path / "run" / "code" / f"{entry['bundle_sha256']}.tar.gz").is_file()


@pytest.mark.parametrize("folder", ["../scripts/ddp_digits", "/etc", "not_there", ""])
def test_a_script_not_in_the_scripts_dir_is_refused_in_one_line_before_anything_is_written(tmp_path, digits_manifest,
                                                                                            folder):
    backend = RecordingBackend(work_dir=str(tmp_path / "jobs"))
    op = TrainOperator(task_id="train", manifest_uri=digits_manifest, run_uri=str(tmp_path / "run"), backend=backend,
                       scripts_dir=str(scripts(tmp_path)), entry={"script": "train.py", "folder": folder})
    with pytest.raises(AirflowFailException) as refused:
        op.execute(context())
    message = str(refused.value)
    assert "\n" not in message and "is not one of the scripts in" in message and "ddp_digits" in message
    assert backend.launched == [] and not (tmp_path / "run").exists()


def test_the_script_comes_only_from_the_entry_argument_not_job_config(tmp_path, digits_manifest):
    with pytest.raises(ConfigError, match="config field 'entry': cannot be set in job_config"):
        operator(tmp_path, digits_manifest, job_config={"entry": {"script": "evil.py", "folder": "/tmp"}})

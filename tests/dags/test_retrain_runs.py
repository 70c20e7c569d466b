"""The whole ringflow_retrain DAG with `dag.test()`: real Great Expectations, real 2-worker Horovod jobs on
this machine, the local folder store. Epochs are kept small so each run takes well under a minute."""
from __future__ import annotations

import datetime as dt
import json
import pathlib
import re

import pytest

from run_folder_files import read_result
from ringflow.training.store import LocalFolderStore

pytestmark = [pytest.mark.pipeline, pytest.mark.timeout(420)]

DAG_ID = "ringflow_retrain"
STEPS = ["validate", "shard", "train", "evaluate", "promote"]


def run(dag, conf: dict):
    dr = dag.test(run_conf=conf)
    tis = {ti.task_id.split(".", 1)[1]: ti for ti in dr.get_task_instances()}
    return dr, tis


def states(tis) -> dict[str, str]:
    return {step: str(tis[step].state) for step in STEPS}


def inject_faults(dag, **overrides) -> None:
    """Tests only: put `overrides` (faults included) into the parsed DAG's train task, as the pipeline
    factory's job_config; `dag.test()` runs these task objects. The deployed form refuses faults."""
    dag.get_task("digits.train").job_config = overrides


def run_folder(store: pathlib.Path, dr) -> pathlib.Path:
    from ringflow.training.core.runs import store_layout

    return pathlib.Path(store_layout.run_uri(str(store), DAG_ID, dr.run_id, "digits"))


def test_ddp_engine_from_the_form_trains_under_torchrun_and_promotes_version_1(airflow_db, dagbag, store):
    """A run from the form promotes version 1 with its files in the run folder; engine=ddp from the form
    reaches the job config, and the local backend launches torchrun for it: the DDP engine refuses to start in
    ranks torchrun did not start (engines/ddp.py), so a success proves it. (The default engine, Horovod, is
    promoted by test_remediation_walks_a_chain_of_faults_to_a_healthy_promoted_model: one whole-DAG run less in CI.)"""
    import os

    dr, tis = run(dagbag.dags[DAG_ID], {"epochs": 2, "model_name": "digits-ddp", "engine": "ddp"})
    assert dr.state == "success", states(tis)
    assert set(states(tis).values()) == {"success"}
    folder = run_folder(store, dr)
    jobs = pathlib.Path(os.environ["RINGFLOW_LOCAL_JOBS"])
    [job_config] = [json.loads(p.read_text()) for p in jobs.glob("*/job.json")
                    if json.loads(p.read_text())["run_uri"] == str(folder)]
    assert job_config["engine"] == "ddp"

    pointer = json.loads((store / "models" / "digits-ddp" / "production.json").read_text())
    assert pointer["version"] == 1 and pointer["previous"] is None
    assert pointer["metrics"]["accuracy"] > 0.5
    assert pointer["run_uri"] == str(folder)
    for name in ("run.json", "eval.json", "health.png"):  # the attempts' own files are under attempts/
        assert (folder / name).is_file(), name
    assert read_result(LocalFolderStore(folder)).verdict.status in ("HEALTHY", "DEGRADED")
    manifests = list((store / "shards" / "digits").glob("*/manifest.json"))
    assert len(manifests) == 1


@pytest.mark.background  # mostly TensorFlow's import in two workers: run beside the main lane (scripts/test.sh)
def test_tensorflow_engine_from_the_form_trains_in_the_tf_venv_and_promotes(airflow_db, dagbag, store, tf_python):
    """engine=tensorflow from the form: the local backend starts one TF worker per rank with its TF_CONFIG, the
    ranks write model.npz, and the torch evaluate step scores it, so promote is the same as for the others."""
    import os

    dr, tis = run(dagbag.dags[DAG_ID], {"epochs": 1, "model_name": "digits-tf", "engine": "tensorflow"})
    assert dr.state == "success", states(tis)
    folder = run_folder(store, dr)
    jobs = pathlib.Path(os.environ["RINGFLOW_LOCAL_JOBS"])
    [job_config] = [json.loads(p.read_text()) for p in jobs.glob("*/job.json")
                    if json.loads(p.read_text())["run_uri"] == str(folder)]
    assert job_config["engine"] == "tensorflow"
    result = read_result(LocalFolderStore(folder))
    assert (result.world_size, result.step) == (2, 22)  # 1 epoch x 22 steps of 2 workers
    pointer = json.loads((store / "models" / "digits-tf" / "production.json").read_text())
    assert pointer["version"] == 1 and pointer["checkpoint"] == result.checkpoint
    assert pointer["metrics"]["accuracy"] > 0.5


def test_broken_dataset_fails_at_validate_and_writes_nothing(airflow_db, dagbag, store, tmp_path, capfd):
    """A CSV that fails the digits suite (a target that is no digit, a pixel out of range) and also holds data the
    suite does not check but training cannot use (NaN cells and a stray "n/a" in feature columns the suite does
    not name): refused at validate, with the columns, counts and rows of both, before any shard, run folder or
    model is written. (Untrainable data alone fails validate too: tests/operators/test_validate.py.)"""
    from ringflow.training.formats.datasets import load_builtin

    df = load_builtin("digits")
    df.loc[[3, 14, 15], "target"] = 12  # not a digit
    df.loc[[7], "pixel_4_4"] = 99.0  # out of the 0..16 range
    df.loc[[3, 14], "pixel_1_1"] = float("nan")
    df["pixel_6_6"] = df["pixel_6_6"].astype(object)
    df.loc[15, "pixel_6_6"] = "n/a"
    broken = tmp_path / "incoming" / "digits-broken.csv"
    broken.parent.mkdir()
    df.to_csv(broken, index=False)

    dr, tis = run(dagbag.dags[DAG_ID], {"epochs": 2, "dataset_uri": str(broken), "model_name": "digits-broken"})
    out = capfd.readouterr().out
    assert dr.state == "failed"
    assert states(tis) == {"validate": "failed", "shard": "upstream_failed", "train": "upstream_failed",
                           "evaluate": "upstream_failed", "promote": "upstream_failed"}
    assert "expect_column_values_to_be_in_set(column='target'" in out and "at rows [3, 14, 15]" in out
    assert "expect_column_values_to_be_between(column='pixel_4_4'" in out and "at rows [7]" in out
    assert "feature column 'pixel_1_1': 2 of 1797 rows" in out and "at rows [3, 14]" in out
    assert "feature column 'pixel_6_6': 1 of 1797 rows" in out and "at rows [15]" in out
    assert not (store / "shards").exists()
    assert not (store / "runs").exists()
    assert not (store / "models").exists()


def test_remediation_walks_a_chain_of_faults_to_a_healthy_promoted_model(airflow_db, dagbag, store, capfd):
    """`remediation: "auto"`, one run, four tries (docs/guides/fault-table.md): try 1 meets a NaN (NONFINITE; the
    injected NaN is not in the data, so the step's replay is finite: a transient fault, retried unchanged,
    resumed before the NaN's step), try 2 an OOM above a per-worker batch of 16
    (the batch halved, twice the backward passes: the same global batch), try 3 a crashed worker (no verdict:
    nothing to change, a plain retry from the newest checkpoint), try 4 trains HEALTHY to the last step (nothing
    lost, nothing repeated) and is promoted (the default engine, Horovod); a gate that requires no remediation
    refuses the same run. One whole-DAG run for all of it: CI time."""
    from ringflow.training.core.gate import Gate
    from ringflow.training.core.promotion import promote_run
    from ringflow.training.formats.checkpoint import step_of
    from ringflow.training.formats.run_folder import RunFolder

    dag = dagbag.dags[DAG_ID]
    train = dag.get_task("digits.train")
    train.retries, train.retry_delay = 3, dt.timedelta(seconds=1)
    oom = [{"kind": "oom", "rank": rank, "step": 15, "above_batch": 16, "on_try": 2} for rank in (0, 1)]
    crash = {"kind": "crash", "rank": 1, "step": 30, "on_try": 3}
    inject_faults(dag, remediation="auto", checkpoint={"every_steps": 5},
                  faults=[{"kind": "nan_gradient", "rank": 1, "step": 10}, *oom, crash])
    dr, tis = run(dag, {"epochs": 2, "model_name": "digits-remedied"})
    out = capfd.readouterr().out
    assert dr.state == "success", states(tis)
    assert tis["train"].try_number == 4
    folder = run_folder(store, dr)
    result = read_result(LocalFolderStore(folder))
    assert result.succeeded and result.verdict.status == "HEALTHY"
    # the crashed try's retry resumed from a checkpoint published before the crash, and ended at the last
    # step: 2 epochs x 22 steps, nothing lost, nothing repeated
    assert result.resumed_from is not None and 15 <= step_of(result.resumed_from) <= 30, result.resumed_from
    assert result.step == 44
    assert [(r["try"], r["verdict"], r["remedy"]) for r in result.remedies] == [
        (2, "NONFINITE", "plain_retry"), (3, "OOM", "smaller_batch")]
    # try 2 resumed before the NaN's step; every try's start record names each rank's node
    starts = [r for r in RunFolder.open(str(folder)).read_health() if r.get("type") == "start"]
    assert len(starts) == 4 and all(len(r["nodes"]) == 2 for r in starts)
    assert starts[1]["resumed_from"] is not None and step_of(starts[1]["resumed_from"]) < 10
    assert (folder / "health.png").is_file()
    # the task log: one line per change, with the why; the health summary names them too
    assert re.search(r"remediation: try 2 will run changed after NONFINITE: NaN/Inf at step 10", out), out[-3000:]
    assert re.search(r"remediation: try 3 will run changed after OOM: out of memory", out), out[-3000:]
    assert "remediated: try 3: smaller_batch after OOM" in out
    pointer = json.loads((store / "models" / "digits-remedied" / "production.json").read_text())
    assert pointer["version"] == 1 and pointer["checkpoint"] == result.checkpoint  # the DAG's gate allows it
    strict = promote_run(LocalFolderStore(store), str(store), str(folder), "digits-strict",
                         Gate(compare_to_production=False, require_no_remediation=True))
    assert not strict.promoted and "requires no remediation" in strict.reason

"""The ringflow_sweep DAG with `dag.test()`: validate and shard once, two mapped candidates (real 2-worker
Horovod jobs on this machine, the local folder store), the first made unhealthy by an injected NaN gradient;
the healthy one is promoted. Which of several healthy candidates wins is the selection's table
(tests/training/core/test_sweep_selection.py) and, on two real evaluated runs, the select task's
(tests/operators/test_tracking.py::test_a_sweeps_winner_is_registered_from_its_own_mlflow_run)."""
from __future__ import annotations

import json
import pathlib

import pytest

from run_folder_files import read_result
from ringflow.training.core.runs import store_layout
from ringflow.training.store import LocalFolderStore

pytestmark = [pytest.mark.pipeline, pytest.mark.timeout(600)]

DAG_ID = "ringflow_sweep"
GROUP = "digits.candidate"
NAN = {"kind": "nan_gradient", "rank": 1, "step": 10}
# The unhealthy one first: the winner is not merely the first candidate.
CONFIGURATIONS = [{"learning_rate": 0.02, "faults": [NAN]}, {"learning_rate": 0.002}]


def allow_faults(dag) -> None:
    """Tests only: let the parsed DAG's configurations Param take injected faults (the deployed form refuses
    them, SWEEP_CONFIGURATIONS_PARAM); `dag.test()` runs this DAG object."""
    for params in [dag.params, *(task.params for task in dag.tasks)]:  # each task holds its own copy
        params.get_param("configurations").schema["items"] = {"type": "object"}


def test_sweep_promotes_the_healthy_candidate_not_the_unhealthy_first_one(airflow_db, dagbag, store):
    dag = dagbag.dags[DAG_ID]
    allow_faults(dag)
    dr = dag.test(run_conf={"configurations": CONFIGURATIONS, "epochs": 1, "model_name": "digits-sweep"})
    tis = {(ti.task_id, ti.map_index): ti for ti in dr.get_task_instances()}
    states = {key: str(ti.state) for key, ti in tis.items()}
    for step in ("digits.validate", "digits.shard", "digits.plan", "digits.select_and_promote"):
        assert states[(step, -1)] == "success", states
    # one shard folder for all candidates
    assert len(list((store / "shards" / "digits").glob("*/manifest.json"))) == 1

    folders = [pathlib.Path(store_layout.run_uri(str(store), DAG_ID, dr.run_id, GROUP, map_index=i)) for i in range(2)]
    results = [read_result(LocalFolderStore(str(f))) for f in folders]  # what each run folder published
    assert len({str(f) for f in folders}) == 2 and all((f / "health.png").is_file() for f in folders)
    # the NaN: its own verdict, its own failed train task, its evaluate never ran
    assert results[0].verdict.status == "NONFINITE" and not results[0].succeeded, results[0]
    assert states[("digits.candidate.train", 0)] == "failed", states
    assert states[("digits.candidate.evaluate", 0)] == "upstream_failed", states
    assert results[1].succeeded and results[1].verdict.status in ("HEALTHY", "DEGRADED"), results[1]
    assert states[("digits.candidate.evaluate", 1)] == "success", states

    accuracy = json.loads((folders[1] / "eval.json").read_text())["metrics"]["accuracy"]
    outcome = tis[("digits.select_and_promote", -1)].xcom_pull(task_ids="digits.select_and_promote")
    assert outcome["promoted"] is True and outcome["winner"] == 1, outcome
    assert "did not succeed" in outcome["candidates"][0]["reason"], outcome
    pointer = json.loads((store / "models" / "digits-sweep" / "production.json").read_text())
    assert pointer["version"] == 1 and pointer["run_uri"] == str(folders[1])
    assert pointer["metrics"]["accuracy"] == accuracy

"""The ringflow_sweep DAG as parsed: shards made once, train >> evaluate in a mapped TaskGroup, one selection
step that runs whatever the candidates did; its configurations Param takes what a trigger form may override."""
from __future__ import annotations

import copy

import pytest

DAG_ID = "ringflow_sweep"


def test_sweep_shape(dagbag):
    from airflow.sdk.definitions.taskgroup import MappedTaskGroup

    dag = dagbag.dags[DAG_ID]
    upstream = {t.task_id: sorted(t.upstream_task_ids) for t in dag.tasks}
    assert upstream == {
        "digits.validate": [], "digits.shard": ["digits.validate"], "digits.plan": ["digits.shard"],
        "digits.candidate.train": ["digits.plan"], "digits.candidate.evaluate": ["digits.candidate.train"],
        "digits.select_and_promote": ["digits.candidate.evaluate", "digits.plan"]}
    assert isinstance(dag.task_group_dict["digits.candidate"], MappedTaskGroup)
    assert dag.get_task("digits.select_and_promote").trigger_rule == "all_done"


@pytest.mark.parametrize("configurations", [
    [],
    [{"faults": [{"kind": "nan_gradient", "rank": 1, "step": 3}]}],  # tests only
    [{"run_uri": "/elsewhere"}],
    [{"learning_rate": 0}],
    [{"model": {"kind": "custom", "factory": "x:y"}}],
    [{"learning_rate": 0.01}] * 33,
])
def test_configurations_param_refuses(dagbag, configurations):
    from airflow.sdk.definitions.param import ParamValidationError

    params = copy.deepcopy(dagbag.dags[DAG_ID].params)
    with pytest.raises(ParamValidationError):
        params.update({"configurations": configurations})
        params.validate()


def test_configurations_param_accepts_a_sweep(dagbag):
    params = copy.deepcopy(dagbag.dags[DAG_ID].params)
    params.update({"configurations": [{"learning_rate": 0.05}, {"batch_size": 16, "epochs": 3},
                                      {"model": {"kind": "mlp", "hidden": [32], "dropout": 0.1},
                                       "optimizer": "sgd"}]})
    assert len(params.validate()["configurations"]) == 3

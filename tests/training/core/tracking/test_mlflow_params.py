"""A job config as MLflow params: dotted keys, JSON text values, MLflow's length limits kept."""
import json

import pytest

from ringflow.training.formats.config import JobConfig
from ringflow.training.core.tracking.params import MAX_VALUE_CHARS, flatten_params


@pytest.mark.parametrize("config, params", [
    ({"epochs": 5}, {"epochs": "5"}),
    ({"engine": "ddp"}, {"engine": "ddp"}),
    ({"learning_rate": 0.002, "seed": 0}, {"learning_rate": "0.002", "seed": "0"}),
    ({"health": {"every_steps": 10, "heartbeat_seconds": None, "enabled": True}},
     {"health.every_steps": "10", "health.heartbeat_seconds": "null", "health.enabled": "true"}),
    ({"model": {"hidden": [64, 64], "kwargs": {}}}, {"model.hidden": "[64, 64]", "model.kwargs": "{}"}),
    ({"a": {"b": {"c": 1}}}, {"a.b.c": "1"}),
    ({"faults": [{"kind": "hang", "rank": 0}]}, {"faults": '[{"kind": "hang", "rank": 0}]'}),
])
def test_flatten(config, params):
    assert flatten_params(config) == params


def test_a_long_value_is_cut_and_says_so():
    value = flatten_params({"x": "y" * (MAX_VALUE_CHARS + 50)})["x"]
    assert len(value) == MAX_VALUE_CHARS and value.endswith(f"… ({MAX_VALUE_CHARS + 50} chars)")


def test_a_whole_job_config_reads_back():
    config = JobConfig.from_dict({"manifest_uri": "/s/manifest.json", "run_uri": "/r", "epochs": 3}).to_dict()
    params = flatten_params(config)
    assert params["epochs"] == "3" and params["run_uri"] == "/r"
    assert json.loads(params["health.stall_seconds"]) == config["health"]["stall_seconds"]
    assert all(len(k) <= 250 and isinstance(v, str) for k, v in params.items())


def test_what_the_retries_changed_is_tagged():
    """Params never change after the first attempt; the remedies of a later one are tags."""
    from ringflow.training.core.tracking.mlflow_runs import TAG_REMEDIATED, TAG_REMEDIES, remedy_tags

    applied = {"try": 2, "verdict": "OOM", "remedy": "smaller_batch", "words": "out of memory: batch 32 -> 16"}
    assert remedy_tags({"remedies": [applied]}) == {
        TAG_REMEDIATED: "true", TAG_REMEDIES: "try 2: smaller_batch after OOM: out of memory: batch 32 -> 16"}
    assert remedy_tags({"remedies": []}) == {TAG_REMEDIATED: "false"} == remedy_tags(None)

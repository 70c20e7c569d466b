"""evaluate_run on a user script's run (its checkpoint's meta names the script): eval.json holds the metrics the
script reported on the eval split (api.report_eval), never ringflow's model's score of weights that are not its
own; a script that reported none is refused in one line naming report_eval."""
from __future__ import annotations

import json

import pytest
from evaluated_runs import make_script_run

from ringflow.training.core.evaluate import evaluate_run
from ringflow.training.core.run_reader import RunNotReady
from ringflow.training.formats.manifest import ShardManifest
from ringflow.training.formats.run_folder import RunFolder
from ringflow.training.store import LocalFolderStore


def test_a_script_runs_eval_json_is_the_metrics_it_reported(tmp_path, digits_manifest):
    store = LocalFolderStore(str(tmp_path / "run"))
    _, checkpoint = make_script_run(store, digits_manifest, {"accuracy": 0.93, "loss": 0.25})

    result = evaluate_run(RunFolder(store))

    eval_rows = ShardManifest.from_json(open(digits_manifest).read()).eval.rows
    assert dict(result.metrics) == {"accuracy": 0.93, "loss": 0.25}
    assert (result.checkpoint, result.step, result.rows, result.task) == (checkpoint, 90, eval_rows, "classification")
    assert json.loads((tmp_path / "run" / "eval.json").read_text())["metrics"] == {"accuracy": 0.93, "loss": 0.25}


def test_a_script_that_reported_no_eval_metrics_is_told_to_call_report_eval(tmp_path, digits_manifest):
    store = LocalFolderStore(str(tmp_path / "run"))
    make_script_run(store, digits_manifest, eval_metrics=None)

    with pytest.raises(RunNotReady) as refused:
        evaluate_run(RunFolder(store))

    message = str(refused.value)
    assert "\n" not in message and "ringflow.training.api.report_eval" in message and "train.py" in message
    assert not (tmp_path / "run" / "eval.json").exists()

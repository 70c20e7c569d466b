"""What one try runs with (training/core/try_plan.py): its own faults, every remedy planned up to it, the
nodes it keeps off and its wait; the run folder's remedies.jsonl read only for a retry under "auto"."""
import pytest

from ringflow.training.core.remediation import PlannedRemedy, Remedy, RemedyAction, RemedyName
from ringflow.training.core.try_plan import (TryPlan, faults_on_try, plan_try, planned_remedies, record_remedy,
                                             recorded)
from ringflow.training.formats.config import JobConfig
from ringflow.training.formats.run_folder import RunFolder

CUT = Remedy(RemedyAction.CHANGE, "NONFINITE", "NaN at step 40", RemedyName.LOWER_LEARNING_RATE,
             {"learning_rate": 0.005}, resume_before_step=40)
AWAY = Remedy(RemedyAction.CHANGE, "DEGRADED/straggler", "slow node", RemedyName.AVOID_NODE, avoid_nodes=("node-b",))
WAIT = Remedy(RemedyAction.CHANGE, "STORE_UNAVAILABLE", "store down", RemedyName.WAIT_FOR_STORE, wait_seconds=60.0)
PLAN = [PlannedRemedy(2, CUT), PlannedRemedy(3, AWAY), PlannedRemedy(4, WAIT)]
CHAIN = [{"kind": "nan_gradient", "rank": 1, "step": 3}, {"kind": "oom", "step": 2, "above_batch": 16, "on_try": 2},
         {"kind": "crash", "rank": 1, "step": 5, "on_try": 3}]


def config(**fields):
    return JobConfig.from_dict({"manifest_uri": "m/manifest.json", "run_uri": "runs/r", "remediation": "auto",
                                "learning_rate": 0.01, "faults": CHAIN} | fields)


def never():
    raise AssertionError("remedies.jsonl read where it must not be")


@pytest.mark.parametrize("try_number, kinds", [(1, ["nan_gradient"]), (2, ["oom"]), (3, ["crash"]), (4, [])])
def test_faults_fire_on_the_try_they_name(try_number, kinds):
    assert [f.kind for f in faults_on_try(config(), try_number).faults] == kinds


# (try, learning rate, resume before, own remedy, avoided nodes, wait)
ROWS = [
    (2, 0.005, 40, RemedyName.LOWER_LEARNING_RATE, (), 0.0),
    (3, 0.005, None, RemedyName.AVOID_NODE, ("node-b",), 0.0),
    (4, 0.005, None, RemedyName.WAIT_FOR_STORE, ("node-b",), 60.0),
    (5, 0.005, None, None, ("node-b",), 0.0),  # no remedy of its own: as the try before
]


@pytest.mark.parametrize("try_number, learning_rate, resume, own, avoid, wait", ROWS)
def test_a_retry_runs_with_every_change_planned_up_to_it(try_number, learning_rate, resume, own, avoid, wait):
    plan = plan_try(config(), try_number, lambda: PLAN)
    assert (plan.config.learning_rate, plan.config.resume_before_step) == (learning_rate, resume)
    assert (plan.own.remedy.remedy if plan.own else None, plan.avoid_nodes, plan.wait_seconds) == (own, avoid, wait)
    assert plan.config.faults == faults_on_try(config(), try_number).faults


@pytest.mark.parametrize("cfg, try_number", [(config(), 1), (config(remediation="off"), 3)])
def test_the_first_try_and_remediation_off_read_no_remedies(cfg, try_number):
    plan = plan_try(cfg, try_number, never)
    assert plan == TryPlan(try_number, faults_on_try(cfg, try_number)) and plan.own is None


def test_a_try_number_counts_from_one():
    with pytest.raises(ValueError, match="tries count from 1"):
        TryPlan(0, config())


def test_remedies_are_kept_in_the_run_folder(tmp_path):
    run = RunFolder.open(str(tmp_path / "run"))
    assert planned_remedies(run) == []
    for planned in PLAN:
        assert record_remedy(run, planned).endswith("remedies.jsonl")
    assert planned_remedies(RunFolder.open(str(tmp_path / "run"))) == PLAN


def test_a_remedy_that_cannot_be_recorded_says_why_and_is_not_taken(tmp_path):
    class Unwritable:
        uri = "s3://gone/run"

        def append_remedy(self, doc):
            raise OSError("the store is down")

    said = []
    assert recorded(RunFolder.open(str(tmp_path / "run")), PLAN[0], said.append) and said == []
    assert not recorded(Unwritable(), PLAN[0], said.append)
    assert said == [f"could not record the remedy for try {PLAN[0].try_number} in s3://gone/run: the store is down; "
                    "the next try runs unchanged"]

"""A TrainJob's status.trainerStatus as rank 0 reports it (health/trainer_status.py): the throttle, the estimates
and the patch body, against the TrainJob CRD's own schema (tests/fixtures/crds, Kubeflow Trainer v2.3.0)."""
from __future__ import annotations

import datetime
import json
import math
import pathlib

import jsonschema
import pytest

from ringflow.training.health.trainer_status import (MAX_METRIC_CHARS, MIN_INTERVAL_SECONDS, TrainerStatus, due,
                                                     metric_values, progress_percentage, remaining_seconds)

SCHEMA = pathlib.Path(__file__).resolve().parents[2] / "fixtures" / "crds" / "trainjob-v1alpha1.schema.json"
NOW = datetime.datetime(2026, 3, 1, 12, 0, 5, tzinfo=datetime.timezone.utc)


@pytest.mark.parametrize("now, last, expected", [
    (100.0, None, True),                          # the first report goes at once
    (100.0, 99.0, False),                         # one second later: too soon
    (100.0, 100.0 - MIN_INTERVAL_SECONDS, True),  # exactly the interval: due
    (104.9, 100.0, False),
    (130.0, 100.0, True),                         # long after (a failed update waits like a sent one)
])
def test_an_update_goes_at_most_every_five_seconds(now, last, expected):
    assert MIN_INTERVAL_SECONDS == 5.0
    assert due(now, last) is expected


@pytest.mark.parametrize("done, total, expected", [(0, 44, 0), (11, 44, 25), (43, 44, 97), (44, 44, 100),
                                                   (50, 44, 100), (3, 0, None)])
def test_progress_is_whole_percent_of_the_data_order(done, total, expected):
    assert progress_percentage(done, total) == expected


@pytest.mark.parametrize("done, total, this_attempt, seconds, expected", [
    (22, 44, 22, 11.0, 11),   # half done at 2 batches/s: 11 s left
    (30, 44, 8, 4.0, 7),      # resumed at 22: only this attempt's rate counts
    (44, 44, 44, 20.0, 0),
    (10, 44, 0, 0.0, None),   # nothing done yet by this attempt: unknown
    (10, 0, 5, 1.0, None),
])
def test_remaining_time_is_this_attempts_rate_over_what_is_left(done, total, this_attempt, seconds, expected):
    assert remaining_seconds(done, total, this_attempt, seconds) == expected


def _trainer_status_schema() -> dict:
    return json.loads(SCHEMA.read_text())["properties"]["status"]["properties"]["trainerStatus"]


def _applied(patch: dict) -> dict:
    """What a JSON merge patch leaves in an empty status: nulls remove."""
    return {k: v for k, v in patch["status"]["trainerStatus"].items() if v is not None}


@pytest.mark.parametrize("status", [
    TrainerStatus(40, 12, metric_values({"loss": 0.123456789, "step": 17, "samples_per_sec": 5123.4}), NOW),
    TrainerStatus(None, None, {}, NOW),
    TrainerStatus(100, 0, metric_values({"loss": math.nan, "x" * 80: "y" * 80}), NOW),
])
def test_the_patch_body_is_a_valid_trainer_status(status):
    body = status.patch_body()
    assert list(body) == ["status"] and list(body["status"]) == ["trainerStatus"]  # nothing else is touched
    applied = _applied(body)
    jsonschema.validate(applied, _trainer_status_schema())
    assert applied["lastUpdatedTime"] == "2026-03-01T12:00:05Z"  # the CEL rule: required whenever present


def test_an_unknown_estimate_is_removed_not_left_stale():
    body = TrainerStatus(None, None, {}, NOW).patch_body()["status"]["trainerStatus"]
    assert body["progressPercentage"] is None and body["estimatedRemainingSeconds"] is None


def test_metrics_are_strings_the_trainjob_accepts():
    values = metric_values({"loss": 0.5, "inf": math.inf, "n" * 70: 3, "empty": ""})
    assert values["loss"] == "0.5" and values["inf"] == "inf" and values["n" * MAX_METRIC_CHARS] == "3"
    assert values["empty"] == "-"


@pytest.mark.parametrize("kwargs, message", [
    ({"progress_percentage": 101}, "0..100"),
    ({"progress_percentage": True}, "0..100"),
    ({"estimated_remaining_seconds": -1}, ">= 0"),
    ({"metrics": {"loss": 0.5}}, "metric_values"),
    ({"last_updated": datetime.datetime(2026, 1, 1)}, "time zone"),
])
def test_a_report_the_trainjob_would_refuse_is_an_error_saying_what_to_give(kwargs, message):
    fields = {"progress_percentage": 1, "estimated_remaining_seconds": 1, "metrics": {}, "last_updated": NOW} | kwargs
    with pytest.raises(ValueError, match=message):
        TrainerStatus(**fields)

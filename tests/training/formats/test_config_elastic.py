"""elastic: recovery inside the job (Horovod elastic), checked before any process starts: its bounds, commit
interval, rejoin cooldown and peer timeout, and refused where it cannot run (DDP, TensorFlow, a user's script)."""
import math

import pytest

from ringflow.training.formats.config import ConfigError, ElasticConfig, JobConfig

BASE = {"manifest_uri": "/m/manifest.json", "run_uri": "/r", "engine": "horovod"}


@pytest.mark.parametrize("section, expected, bounds_of_3", [
    (None, None, None),
    ({}, ElasticConfig(), (1, 3)),
    ({"min_workers": 2, "max_workers": 4, "commit_every_steps": 50, "rejoin_seconds": 5, "peer_timeout_seconds": 20,
      "wait_seconds": 30, "rendezvous_timeout_seconds": 40}, ElasticConfig(2, 4, 50, 5, 20, 30, 40), (2, 4)),
])
def test_elastic_is_off_unless_given(section, expected, bounds_of_3):
    cfg = JobConfig.from_dict(BASE | {"elastic": section})
    assert cfg.elastic == expected
    assert JobConfig.from_dict(cfg.to_dict()) == cfg  # round-trips
    if expected is not None:
        assert cfg.elastic.bounds(3) == bounds_of_3
        assert cfg.elastic.environment() == {
            "HOROVOD_GLOO_TIMEOUT_SECONDS": str(math.ceil(expected.rendezvous_timeout_seconds)),
            "HOROVOD_GLOO_OP_TIMEOUT_SECONDS": f"{expected.peer_timeout_seconds:g}"}


@pytest.mark.parametrize("section, rendezvous, collectives", [
    ({}, "30", "3"),                                              # the defaults: joins get time, deaths are found fast
    ({"peer_timeout_seconds": 0.5, "rendezvous_timeout_seconds": 12.5}, "13", "0.5"),  # Horovod reads whole seconds
])
def test_gloo_gets_a_rendezvous_timeout_and_a_collectives_timeout_of_its_own(section, rendezvous, collectives):
    env = JobConfig.from_dict(BASE | {"elastic": section}).elastic.environment()
    assert env == {"HOROVOD_GLOO_TIMEOUT_SECONDS": rendezvous, "HOROVOD_GLOO_OP_TIMEOUT_SECONDS": collectives}


@pytest.mark.parametrize("fields, field, says", [
    ({"elastic": {"min_workers": 0}}, "elastic.min_workers", "use a whole number >= 1"),
    ({"elastic": {"min_workers": 3, "max_workers": 2}}, "elastic.max_workers", "give max_workers >= min_workers"),
    ({"elastic": {"commit_every_steps": 0}}, "elastic.commit_every_steps", "use a whole number >= 1"),
    ({"elastic": {"rejoin_seconds": 0}}, "elastic.rejoin_seconds", "use a number > 0"),
    ({"elastic": {"peer_timeout_seconds": -1}}, "elastic.peer_timeout_seconds", "use a number > 0"),
    ({"elastic": {"peer_timeout_seconds": 0.0001}}, "elastic.peer_timeout_seconds", "use at least 0.1 s"),
    ({"elastic": {"wait_seconds": 0}}, "elastic.wait_seconds", "use a number > 0"),
    ({"elastic": {"rendezvous_timeout_seconds": 0}}, "elastic.rendezvous_timeout_seconds", "use a number > 0"),
    ({"elastic": {"rendezvous_timeout_seconds": 120}}, "elastic.rendezvous_timeout_seconds", "use less than 120 s"),
    ({"elastic": {"workers": 2}}, "elastic.workers", "remove it or use one of"),
    ({"elastic": 2}, "elastic", "give a JSON object"),
    ({"engine": "ddp", "elastic": {}, "ddp": {"local_sgd": {"period": 4}}}, "elastic", "is set with ddp.local_sgd"),
    ({"engine": "tensorflow", "elastic": {}}, "elastic", 'use "engine": "horovod"'),
    ({"elastic": {}, "entry": {"script": "train.py"}}, "elastic", "recovery inside the job runs ringflow's own loop"),
    # the survivors' wait in a rendezvous as long as start-up's allowance: a stall verdict, not the wait's reason
    ({"elastic": {"wait_seconds": 120}}, "elastic.wait_seconds", "use less than 120 s"),
    ({"elastic": {"wait_seconds": 60}, "health": {"stall_seconds": 12}}, "elastic.wait_seconds",
     "use less than 60 s, or raise health.stall_seconds"),
])
def test_bad_elastic_settings_say_what_to_do(fields, field, says):
    with pytest.raises(ConfigError) as err:
        JobConfig.from_dict(BASE | fields)
    assert err.value.field == field and says in str(err.value), str(err.value)


@pytest.mark.parametrize("stall_seconds, wait_seconds", [(12, 45), (12, 59), (300, 299), (120, 119)])
def test_a_wait_under_the_rendezvous_allowance_is_taken(stall_seconds, wait_seconds):
    cfg = JobConfig.from_dict(BASE | {"elastic": {"wait_seconds": wait_seconds}, "health": {"stall_seconds": stall_seconds}})
    assert cfg.elastic.wait_seconds == wait_seconds


def test_an_elastic_worker_re_inits_horovod_without_the_cycle_time():
    """Horovod 0.28.1 segfaults in a survivor's hvd.init() after a death when both knobs are set (tried)."""
    horovod = JobConfig.from_dict(BASE).horovod
    assert set(horovod.environment()) >= {"HOROVOD_FUSION_THRESHOLD", "HOROVOD_CYCLE_TIME"}
    assert "HOROVOD_CYCLE_TIME" not in horovod.environment(elastic=True)
    assert "HOROVOD_FUSION_THRESHOLD" in horovod.environment(elastic=True)

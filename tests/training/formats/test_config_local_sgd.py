"""ddp.local_sgd: post-local SGD's period and warm-up, checked before any process starts, and refused where
it cannot run (Horovod, fp16) with what to do instead."""
import pytest

from ringflow.training.formats.config import ConfigError, JobConfig, LocalSgdConfig
from ringflow.training.rank.engines import engine_name

BASE = {"manifest_uri": "/m/manifest.json", "run_uri": "/r", "engine": "ddp"}


@pytest.mark.parametrize("section, expected", [
    ({}, None),
    ({"local_sgd": None}, None),
    ({"local_sgd": {"period": 4}}, LocalSgdConfig(period=4, warmup_steps=0)),
    ({"local_sgd": {"period": 1, "warmup_steps": 100}}, LocalSgdConfig(period=1, warmup_steps=100)),
])
def test_local_sgd_is_off_unless_given_a_period(section, expected):
    cfg = JobConfig.from_dict(BASE | {"ddp": section})
    assert cfg.ddp.local_sgd == expected
    assert JobConfig.from_dict(cfg.to_dict()) == cfg  # round-trips


@pytest.mark.parametrize("fields, field, says", [
    ({"ddp": {"local_sgd": {}}}, "ddp.local_sgd.period", "is missing"),
    ({"ddp": {"local_sgd": {"period": 0}}}, "ddp.local_sgd.period", "use a whole number >= 1"),
    ({"ddp": {"local_sgd": {"period": 2.5}}}, "ddp.local_sgd.period", "remove ddp.local_sgd for synchronous"),
    ({"ddp": {"local_sgd": {"period": True}}}, "ddp.local_sgd.period", "use a whole number >= 1"),
    ({"ddp": {"local_sgd": {"period": 4, "warmup_steps": -1}}}, "ddp.local_sgd.warmup_steps",
     "use a whole number >= 0"),
    ({"ddp": {"local_sgd": {"period": 4, "warmup": 10}}}, "ddp.local_sgd.warmup",
     "remove it or use one of ['period', 'warmup_steps']"),
    ({"ddp": {"local_sgd": 4}}, "ddp.local_sgd", "give a JSON object"),
    ({"engine": "horovod", "ddp": {"local_sgd": {"period": 4}}}, "ddp.local_sgd", 'use "engine": "ddp"'),
    ({"precision": "fp16", "ddp": {"local_sgd": {"period": 4}}}, "ddp.local_sgd", 'use "bf16" or "fp32"'),
])
def test_bad_local_sgd_settings_say_what_to_do(fields, field, says):
    with pytest.raises(ConfigError) as err:
        JobConfig.from_dict(BASE | fields)
    assert err.value.field == field and says in str(err.value), str(err.value)


def test_local_sgd_goes_with_accumulation_and_bf16():
    cfg = JobConfig.from_dict(BASE | {"precision": "bf16", "ddp": {"backward_passes_per_step": 2,
                                                                   "local_sgd": {"period": 4}}})
    assert cfg.ddp.local_sgd.period == 4 and cfg.ddp.backward_passes_per_step == 2


def test_an_engine_override_to_horovod_is_refused_before_launch():
    cfg = JobConfig.from_dict(BASE | {"ddp": {"local_sgd": {"period": 4}}})
    assert engine_name(cfg) == "ddp"
    with pytest.raises(ConfigError) as err:
        engine_name(cfg, "horovod")  # ringflow train --engine horovod
    assert err.value.field == "ddp.local_sgd" and "is set, but the engine is 'horovod'" in str(err.value)

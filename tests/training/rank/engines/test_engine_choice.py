"""Which engine a job runs, decided in one place: the config's `engine`, or the launch's override."""
import pytest

from ringflow.training.formats.config import ConfigError, JobConfig
from ringflow.training.rank.engines import ENGINE_ENV, engine_name
from ringflow.training.rank.engines.ddp import DdpEngine


def job(**fields) -> JobConfig:
    return JobConfig.from_dict({"manifest_uri": "/m/manifest.json", "run_uri": "/r"} | fields)


@pytest.mark.parametrize("fields, override, expected", [
    ({}, None, "horovod"),                    # Horovod stays the default
    ({"engine": "ddp"}, None, "ddp"),
    ({}, "ddp", "ddp"),                       # ringflow train --engine ddp
    ({"engine": "ddp"}, "horovod", "horovod"),
])
def test_engine_name(fields, override, expected):
    assert engine_name(job(**fields), override) == expected


def test_an_unknown_override_says_where_it_came_from():
    with pytest.raises(ConfigError, match=f"from --engine or \\${ENGINE_ENV}.*use one of"):
        engine_name(job(), "mpi")


def test_a_ddp_rank_not_started_by_torchrun_is_told_how_to_launch():
    with pytest.raises(RuntimeError, match=r"no RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT.*--engine ddp"):
        DdpEngine.start(job(engine="ddp"), environ={})


LOCAL_SGD = {"engine": "ddp", "ddp": {"local_sgd": {"period": 4}}}


@pytest.mark.parametrize("fields, override, refused", [
    # (the config, which its own engine accepts; --engine; the field the override is refused on, or None)
    ({"precision": "bf16"}, "tensorflow", "precision"),
    ({"faults": [{"kind": "hang"}]}, "tensorflow", "faults[].kind"),
    ({"faults": [{"kind": "perturb_replica"}]}, "tensorflow", "faults[].kind"),
    ({"faults": [{"kind": "crash"}]}, "tensorflow", None),
    (LOCAL_SGD, "tensorflow", "ddp.local_sgd"),
    (LOCAL_SGD, "horovod", "ddp.local_sgd"),
    (LOCAL_SGD | {"precision": "bf16"}, "ddp", None),
    ({"engine": "tensorflow"}, "horovod", None),
    ({"precision": "bf16", "faults": [{"kind": "hang"}]}, "ddp", None),
])
def test_an_override_is_checked_against_the_config_as_the_config_checks_its_own_engine(fields, override, refused):
    cfg = job(**fields)
    if refused is None:
        assert engine_name(cfg, override) == override
        return
    with pytest.raises(ConfigError) as err:
        engine_name(cfg, override)
    assert err.value.field == refused
    # The same refusal as a config that names the engine itself: one check for both.
    with pytest.raises(ConfigError) as own:
        job(**(fields | {"engine": override}))
    assert str(own.value) == str(err.value)

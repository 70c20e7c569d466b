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

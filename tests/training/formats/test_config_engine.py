"""The job config's engine choice and its `ddp` section: checked before any process starts."""
import pytest

from ringflow.training.formats.config import ConfigError, DdpConfig, JobConfig

BASE = {"manifest_uri": "/m/manifest.json", "run_uri": "/r"}


def test_horovod_is_the_default_and_ddp_has_torchs_bucket_size():
    cfg = JobConfig.from_dict(BASE)
    assert cfg.engine == "horovod" and cfg.ddp == DdpConfig(bucket_cap_mb=25.0, backward_passes_per_step=1)
    assert JobConfig.from_dict(cfg.to_dict()) == cfg  # round-trips with both sections


@pytest.mark.parametrize("fields, field, says", [
    ({"engine": "torch"}, "engine", 'use "horovod" (horovodrun/mpirun) or "ddp"'),
    ({"engine": None}, "engine", 'use "horovod"'),
    ({"ddp": {"bucket_cap_mb": 0}}, "ddp.bucket_cap_mb", "use a number > 0"),
    ({"ddp": {"backward_passes_per_step": 0}}, "ddp.backward_passes_per_step", "use a whole number >= 1"),
    ({"ddp": {"bucket_mb": 4}}, "ddp.bucket_mb", "remove it or use one of ['backward_passes_per_step', 'bucket_cap_mb', 'local_sgd']"),
    ({"ddp": 4}, "ddp", "give a JSON object"),
])
def test_bad_engine_settings_say_what_to_do(fields, field, says):
    with pytest.raises(ConfigError) as err:
        JobConfig.from_dict(BASE | fields)
    assert err.value.field == field and says in str(err.value)

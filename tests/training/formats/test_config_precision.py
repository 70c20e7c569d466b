"""The job config's `precision`: checked before any process starts (where it can run: test_devices.py)."""
import pytest

from ringflow.training.formats.config import ConfigError, JobConfig


def test_precision_is_fp32_by_default_and_round_trips():
    base = {"manifest_uri": "/m/manifest.json", "run_uri": "/r"}
    assert JobConfig.from_dict(base).precision == "fp32"
    cfg = JobConfig.from_dict(base | {"precision": "bf16"})
    assert JobConfig.from_dict(cfg.to_dict()) == cfg


@pytest.mark.parametrize("value", ["float16", "FP16", "amp", None, 16])
def test_an_unknown_precision_says_what_to_choose(value):
    with pytest.raises(ConfigError) as err:
        JobConfig.from_dict({"manifest_uri": "/m/manifest.json", "run_uri": "/r", "precision": value})
    assert err.value.field == "precision" and f"is {value!r}" in str(err.value)
    assert '"fp16" (autocast to float16 with loss scaling, GPU only)' in str(err.value)

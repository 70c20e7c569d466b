"""The job config's `tensorflow` section, and what the TensorFlow engine refuses before any process starts."""
import pytest

from ringflow.training.formats.config import ConfigError, JobConfig, TensorflowConfig

BASE = {"manifest_uri": "/s/manifest.json", "run_uri": "/r", "engine": "tensorflow"}


@pytest.mark.parametrize("doc, expected", [
    ({}, TensorflowConfig("ring")),
    ({"tensorflow": {"communication": "auto"}}, TensorflowConfig("auto")),
])
def test_the_section(doc, expected):
    assert JobConfig.from_dict(BASE | doc).tensorflow == expected


@pytest.mark.parametrize("doc, refused", [
    ({"tensorflow": {"communication": "nccl"}}, r"'tensorflow.communication': is 'nccl'; use one of \('ring', 'auto'\)"),
    ({"tensorflow": {"ring": True}}, r"'tensorflow.ring': is not a known field"),
    ({"precision": "bf16"}, r"'precision': is 'bf16' with engine \"tensorflow\"; use \"fp32\""),
    ({"faults": [{"kind": "hang"}]}, r"'faults\[\].kind': is 'hang' with engine \"tensorflow\""),
])
def test_refused(doc, refused):
    with pytest.raises(ConfigError, match=refused):
        JobConfig.from_dict(BASE | doc)


def test_other_engines_keep_their_precisions_and_faults():
    cfg = JobConfig.from_dict(BASE | {"engine": "horovod", "precision": "bf16", "faults": [{"kind": "hang"}]})
    assert cfg.precision == "bf16"

"""A user's own training script on Kubernetes (job_parts.py): a job config with a pinned entry builds the same
strict-valid MPIJob (Horovod) and TrainJob (DDP, TensorFlow) as ringflow's own loop, the pods running
`python -m ringflow.training CONFIG` (TensorFlow: through its pod entry) with the bundle's sha256 in the config:
the bundle travels in the run folder in the store, so no volume is added, and what the script imports beyond its
folder is the image's business. An entry that still names a local folder never reaches a cluster."""
from __future__ import annotations

import json

import pytest

import strict_schema
from test_mpijob_manifest import spec
from test_trainjob_manifest import DEFAULT
from ringflow.training.core.backends.job_spec import JobSpecError
from ringflow.training.core.backends.kubernetes.job_parts import build_configmap
from ringflow.training.core.backends.kubernetes.mpijob import MPIJobSettings, build_mpijob
from ringflow.training.core.backends.kubernetes.settings import TrainJobSettings
from ringflow.training.core.backends.kubernetes.trainjob import build_trainjob
from ringflow.training.formats.code_bundle import pin_entry
from ringflow.training.formats.config import JobConfig
from ringflow.training.store import LocalFolderStore

KINDS = {"horovod": (build_mpijob, MPIJobSettings), "ddp": (build_trainjob, TrainJobSettings),
         "tensorflow": (build_trainjob, TrainJobSettings)}


def configs(tmp_path, engine):
    """(ringflow's loop's job config, the same with a user script pinned into its run folder) for `engine`."""
    (tmp_path / "code").mkdir(exist_ok=True)
    (tmp_path / "code" / "train.py").write_text("import ringflow.training.api as ringflow\n")
    loop = JobConfig.from_dict({"manifest_uri": "s3://ml/shards/m.json", "run_uri": "s3://ml/runs/r1",
                                "engine": engine})
    local = JobConfig.from_dict({**loop.to_dict(), "entry": {"script": "train.py", "args": ["--fast"],
                                                             "folder": str(tmp_path / "code")}})
    return loop.to_dict(), local.to_dict(), pin_entry(local, LocalFolderStore(str(tmp_path / "run"))).to_dict()


@pytest.mark.parametrize("engine", sorted(KINDS))
def test_a_pinned_script_builds_the_loops_strict_valid_job_with_the_bundle_in_its_config(tmp_path, engine):
    build, settings_class = KINDS[engine]
    settings = settings_class.from_dict(DEFAULT)
    loop, _, pinned = configs(tmp_path, engine)

    job = build(spec(config=pinned), settings)

    strict_schema.assert_valid(job)
    assert job == build(spec(config=loop), settings)  # the same pods, commands and volumes as ringflow's loop
    text = json.dumps(job)
    assert "ringflow.training" in text and "/etc/ringflow/job.json" in text
    entry = json.loads(build_configmap(spec(config=pinned), settings)["data"]["job.json"])["entry"]
    assert entry["folder"] is None and len(entry["bundle_sha256"]) == 64 and entry["args"] == ["--fast"]


@pytest.mark.parametrize("engine", sorted(KINDS))
def test_an_entry_never_pinned_is_refused_before_any_manifest_is_built(tmp_path, engine):
    build, settings_class = KINDS[engine]
    _, local, _ = configs(tmp_path, engine)
    with pytest.raises(JobSpecError) as refused:
        build(spec(config=local), settings_class.from_dict(DEFAULT))
    message = str(refused.value)
    assert "\n" not in message and "never packed" in message and "pin" in message

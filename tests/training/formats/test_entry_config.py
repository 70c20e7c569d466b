"""The job config's entry (formats/config.py's EntryConfig): the user's script or function, its args, and its
folder or the bundle sha256 the launch pinned, checked before anything is packed or run."""
import pytest

from ringflow.training.formats.config import ConfigError, EntryConfig, JobConfig

SHA = "ab" * 32


def job(entry, **more) -> JobConfig:
    return JobConfig.from_dict({"manifest_uri": "/data/manifest.json", "run_uri": "/data/run", "entry": entry} | more)


@pytest.mark.parametrize("entry, expected", [
    ({"script": "train.py", "folder": "scripts/mine", "args": ["--epochs", "2"]},
     EntryConfig("train.py", ("--epochs", "2"), "scripts/mine")),
    ({"script": "sub/train.py", "bundle_sha256": SHA}, EntryConfig("sub/train.py", (), None, SHA)),
    ({"script": "/opt/code/train.py"}, EntryConfig("/opt/code/train.py")),  # a path in the image
    ({"script": "my_pkg.train:main"}, EntryConfig("my_pkg.train:main")),
])
def test_good_entries_and_their_round_trip(entry, expected):
    cfg = job(entry)
    assert cfg.entry == expected and JobConfig.from_dict(cfg.to_dict()) == cfg
    assert cfg.entry.bundled == ("folder" in entry or "bundle_sha256" in entry)
    assert cfg.entry.is_function == (":" in entry["script"])


@pytest.mark.parametrize("entry, field, hint", [
    ({"script": ""}, "entry.script", "give a script path"),
    ({"script": "train.txt"}, "entry.script", "give a .py file"),
    ({"script": "train"}, "entry.script", "give a .py file"),
    ({"script": "my pkg:main"}, "entry.script", "import path"),
    ({"script": "my_pkg.train:main", "folder": "code"}, "entry.script", "the script's path inside the folder"),
    ({"script": "../train.py", "folder": "code"}, "entry.script", "the script's path inside the folder"),
    ({"script": "sub/../../train.py", "folder": "code"}, "entry.script", "inside the folder"),
    ({"script": "/abs/train.py", "folder": "code"}, "entry.script", "inside the folder"),
    ({"script": "../train.py", "bundle_sha256": SHA}, "entry.script", "inside the folder"),
    ({"script": "train.py", "folder": "code", "bundle_sha256": SHA}, "entry", "give the folder only"),
    ({"script": "train.py", "bundle_sha256": "AB" * 32}, "entry.bundle_sha256", "64 lowercase hex"),
    ({"script": "train.py", "bundle_sha256": "ab"}, "entry.bundle_sha256", "the launch pins it"),
    ({"script": "train.py", "folder": ""}, "entry.folder", "give the folder holding the script"),
    ({"script": "train.py", "args": "--epochs 2"}, "entry.args", "a list of strings"),
    ({"script": "train.py", "args": ["--epochs", 2]}, "entry.args", "a list of strings"),
    ({"script": "train.py", "where": "x"}, "entry.where", "not a known field"),
])
def test_bad_entries_are_refused_naming_the_field_and_the_fix(entry, field, hint):
    with pytest.raises(ConfigError, match=hint) as caught:
        job(entry)
    assert caught.value.field == field


def test_a_script_takes_only_the_faults_that_fire_in_report():
    entry = {"script": "train.py", "folder": "code"}
    assert job(entry, faults=[{"kind": "crash", "rank": 1, "step": 5}, {"kind": "hang", "step": 9}]).faults
    with pytest.raises(ConfigError, match="they fire at a report\\(\\) step") as caught:
        job(entry, faults=[{"kind": "nan_gradient", "step": 5}])
    assert caught.value.field == "faults[].kind"
    assert job(None).entry is None  # ringflow's own loop

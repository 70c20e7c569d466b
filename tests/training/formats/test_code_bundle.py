"""The user's code bundle (formats/code_bundle.py): a reproducible pack of the script's folder, pinned by its
sha256 at the launch, and refused by the launch and by every rank when it is not the pinned one."""
import io
import os
import tarfile

import pytest

from ringflow.training.formats import code_bundle
from ringflow.training.formats.code_bundle import (BundleError, bundle_key, fetch_bundle, pack, pin_entry, read_bundle,
                                                   sha256_of)
from ringflow.training.formats.config import EntryConfig, JobConfig
from ringflow.training.store import LocalFolderStore


@pytest.fixture
def code(tmp_path):
    folder = tmp_path / "code"
    (folder / "lib").mkdir(parents=True)
    (folder / "train.py").write_text("print('training')\n")
    (folder / "lib" / "helpers.py").write_text("X = 1\n")
    for left_out in ("__pycache__/train.cpython-311.pyc", ".git/HEAD", "lib/helpers.pyc", ".env"):
        (folder / left_out).parent.mkdir(parents=True, exist_ok=True)
        (folder / left_out).write_text("not code")
    return folder


def job(tmp_path, **entry) -> JobConfig:
    return JobConfig.from_dict({"manifest_uri": "/data/manifest.json", "run_uri": str(tmp_path / "run"),
                                "engine": "ddp", "entry": {"script": "train.py"} | entry})


def names(data: bytes) -> list[str]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        return sorted(tar.getnames())


def test_the_pack_is_reproducible_and_holds_the_code_only(code):
    first = pack(str(code))
    os.utime(code / "train.py", (1, 1))  # times, owners and the gzip header never enter the pack
    assert pack(str(code)) == first and sha256_of(first) == sha256_of(pack(str(code)))
    assert names(first) == ["lib/helpers.py", "train.py"]
    (code / "train.py").write_text("print('changed')\n")
    assert sha256_of(pack(str(code))) != sha256_of(first)


def test_pin_writes_the_bundle_once_and_pins_its_sha256(code, tmp_path):
    cfg = job(tmp_path, folder=str(code), args=["--fast"])
    store = LocalFolderStore(cfg.run_uri)
    pinned = pin_entry(cfg, store)
    digest = sha256_of(pack(str(code)))
    assert pinned.entry == EntryConfig("train.py", ("--fast",), None, digest)
    assert store.get_bytes(bundle_key(digest)) == pack(str(code))
    written = os.stat(tmp_path / "run" / bundle_key(digest)).st_mtime_ns
    assert pin_entry(cfg, store) == pinned  # the same code again: nothing written
    assert os.stat(tmp_path / "run" / bundle_key(digest)).st_mtime_ns == written
    assert pin_entry(pinned, store) == pinned  # pinned already: checked, unchanged
    relative = job(tmp_path, folder="code")
    assert pin_entry(relative, store, relative_to=str(tmp_path)).entry.bundle_sha256 == digest


def test_a_rank_unpacks_the_pinned_bundle(code, tmp_path):
    cfg = job(tmp_path, folder=str(code))
    store = LocalFolderStore(cfg.run_uri)
    unpacked = fetch_bundle(pin_entry(cfg, store).entry, store, into=str(tmp_path))
    assert (tmp_path / unpacked / "train.py").read_text() == "print('training')\n"
    assert sorted(os.listdir(unpacked)) == ["lib", "train.py"]


def test_a_bundle_changed_after_the_pin_is_refused_at_the_launch_and_by_each_rank(code, tmp_path):
    store = LocalFolderStore(str(tmp_path / "run"))
    pinned = pin_entry(job(tmp_path, folder=str(code)), store)
    (code / "train.py").write_text("import os; os.remove('/important')\n")
    store.put_bytes(bundle_key(pinned.entry.bundle_sha256), pack(str(code)))
    for refuse in (lambda: pin_entry(pinned, store), lambda: fetch_bundle(pinned.entry, store, str(tmp_path)),
                   lambda: read_bundle(pinned.entry, store)):
        with pytest.raises(BundleError, match="changed after the launch; refused, nothing of it ran"):
            refuse()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["code", "run"]  # nothing unpacked


def test_a_missing_bundle_and_a_folder_never_pinned_are_refused(code, tmp_path):
    store = LocalFolderStore(str(tmp_path / "run"))
    never_written = EntryConfig("train.py", bundle_sha256="ab" * 32)
    with pytest.raises(BundleError, match="is missing: launch the job again"):
        fetch_bundle(never_written, store)
    with pytest.raises(BundleError, match="is missing"):
        pin_entry(job(tmp_path, bundle_sha256="ab" * 32), store)
    with pytest.raises(BundleError, match="was never packed: launch the job with ringflow train"):
        fetch_bundle(EntryConfig("train.py", folder=str(code)), store)


def test_a_folder_too_big_missing_or_without_the_script_is_refused(code, tmp_path, monkeypatch):
    store = LocalFolderStore(str(tmp_path / "run"))
    monkeypatch.setattr(code_bundle, "MAX_BUNDLE_BYTES", 2**20)
    (code / "digits.npy").write_bytes(b"\0" * (2**20 + 1))
    with pytest.raises(BundleError, match="keep data and models out of the code folder"):
        pin_entry(job(tmp_path, folder=str(code)), store)
    with pytest.raises(BundleError, match="is not a folder"):
        pack(str(tmp_path / "nowhere"))
    with pytest.raises(BundleError, match="'other.py' is not a file in entry.folder"):
        pin_entry(job(tmp_path, script="other.py", folder=str(code)), store)
    assert not (tmp_path / "run").exists()  # nothing written


def planted(member: tarfile.TarInfo, data: bytes = b"") -> bytes:
    """A tar.gz pack() would never make, holding `member`."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz") as tar:
        script = tarfile.TarInfo("train.py")
        script.size = 3
        tar.addfile(script, io.BytesIO(b"x=1"))
        member.size = len(data)
        tar.addfile(member, io.BytesIO(data))
    return raw.getvalue()


def symlink(name: str, target: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = tarfile.SYMTYPE, target
    return info


@pytest.mark.parametrize("member, data", [
    (symlink("secrets", "/etc/passwd"), b""),              # a link to an absolute path
    (symlink("up", "../../outside"), b""),                  # a link out of the folder
    (tarfile.TarInfo("../escaped.py"), b"print('out')"),    # a member out of the folder
    (tarfile.TarInfo("/abs.py"), b"print('abs')"),          # an absolute member: made relative, kept inside
])
def test_a_pinned_tar_with_links_or_paths_out_is_refused_by_the_data_filter(tmp_path, member, data):
    """Pinned (its sha256 matches), yet not a plain folder's pack: nothing lands outside the unpacked folder."""
    store = LocalFolderStore(str(tmp_path / "run"))
    bundle = planted(member, data)
    entry = EntryConfig("train.py", bundle_sha256=sha256_of(bundle))
    store.put_bytes(bundle_key(entry.bundle_sha256), bundle)
    into = tmp_path / "unpacked"
    into.mkdir()
    if member.name == "/abs.py":  # the data filter strips the leading slash
        folder = fetch_bundle(entry, store, str(into))
        assert sorted(os.listdir(folder)) == ["abs.py", "train.py"]
        return
    with pytest.raises(BundleError, match="is not a plain folder's pack .*refused, nothing of it ran"):
        fetch_bundle(entry, store, str(into))
    assert os.listdir(into) == [] and not (tmp_path / "escaped.py").exists()

"""state.pt loads with weights_only: tensors and plain data only, so a planted pickle runs nothing. Its job test
is also where a real job's resume skips a truncated checkpoint and a rerun of a finished job keeps its verdict."""
from __future__ import annotations

import io
import os
import pickle

import pytest
import torch

from ringflow.training.formats.checkpoint import CheckpointStore
from ringflow.training.store import LocalFolderStore
from ringflow.training.rank.training_state import STATE_FILE, TrainingState, UnsafeCheckpoint


class _RunsAShellCommand:
    """What an attacker with write access to the bucket would plant: unpickling it runs `touch <marker>`."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def _planted_state(marker) -> bytes:
    buf = io.BytesIO()
    torch.save({"model": {}, "optimizer": {}, "cursor": [0, 0], "step": 0, "torch_rng": torch.get_rng_state(),
                "payload": _RunsAShellCommand(str(marker))}, buf)
    return buf.getvalue()


def _real_state() -> TrainingState:
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    model(torch.randn(8, 4)).sum().backward()
    optimizer.step()
    return TrainingState(model=model.state_dict(), optimizer=optimizer.state_dict(), cursor=(2, 5), step=17,
                         torch_rng=torch.get_rng_state())


def test_the_state_ringflow_writes_loads_back_with_weights_only():
    state = _real_state()
    loaded = TrainingState.from_bytes(state.to_bytes(), "test")
    assert (loaded.cursor, loaded.step) == ((2, 5), 17)
    torch.testing.assert_close(loaded.model, state.model)
    assert loaded.optimizer["param_groups"] == state.optimizer["param_groups"]
    torch.testing.assert_close(loaded.optimizer["state"], state.optimizer["state"])
    assert torch.equal(loaded.torch_rng, state.torch_rng)
    assert loaded.grad_scaler is None  # no loss scaling outside fp16


def test_fp16_loss_scale_is_kept_with_weights_only_and_restores_a_scaler():
    """A resumed fp16 run goes on with the loss scale it had reached (GradScaler's state is numbers only)."""
    import dataclasses

    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16, growth_interval=1)
    for _ in range(3):  # each step without overflow doubles the scale (growth_interval 1)
        scaler.scale(model(torch.randn(8, 4)).sum()).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
    assert scaler.get_scale() == 2.0**19
    state = dataclasses.replace(_real_state(), grad_scaler=scaler.state_dict())
    loaded = TrainingState.from_bytes(state.to_bytes(), "test")
    assert loaded.grad_scaler == scaler.state_dict()
    resumed = torch.amp.GradScaler("cpu")
    resumed.load_state_dict(loaded.grad_scaler)
    assert resumed.get_scale() == 2.0**19


def test_a_state_file_loads_from_its_path_as_from_its_bytes_and_a_planted_one_is_refused(tmp_path):
    """from_file: a host's peer copy (rank/ddp_elastic.py) read straight from the memory disk, with the same
    weights_only loader."""
    state, path = _real_state(), tmp_path / STATE_FILE
    state.save(str(path))
    loaded = TrainingState.from_file(str(path))
    assert (loaded.cursor, loaded.step) == ((2, 5), 17)
    torch.testing.assert_close(loaded.model, state.model)
    torch.testing.assert_close(loaded.optimizer["state"], state.optimizer["state"])
    marker, planted = tmp_path / "pwned", tmp_path / "planted.pt"
    planted.write_bytes(_planted_state(marker))
    with pytest.raises(UnsafeCheckpoint, match=r"refused to load .*planted\.pt.*nothing in it was run"):
        TrainingState.from_file(str(planted))
    assert not marker.exists()


def test_a_planted_pickle_is_refused_and_runs_nothing(tmp_path):
    marker = tmp_path / "pwned"
    planted = _planted_state(marker)
    with pytest.raises(UnsafeCheckpoint, match=r"refused to load .*nothing in it was run"):
        TrainingState.from_bytes(planted, "s3://b/run/checkpoints/ckpt-000000010/state.pt")
    assert not marker.exists()
    # The control: the same bytes loaded the old way run the command, so the test above can fail.
    torch.load(io.BytesIO(planted), weights_only=False)
    assert marker.exists()


@pytest.mark.parametrize("doc, problem", [
    ([1, 2, 3], "holds a list"),
    ({"model": {}}, "not a ringflow training state"),
])
def test_plain_data_that_is_not_a_training_state_is_refused(doc, problem):
    buf = io.BytesIO()
    torch.save(doc, buf)
    with pytest.raises(UnsafeCheckpoint, match=problem):
        TrainingState.from_bytes(buf.getvalue(), "here")


def test_a_plain_pickle_that_is_no_torch_file_is_refused(tmp_path):
    marker = tmp_path / "pwned"
    with pytest.raises((UnsafeCheckpoint, pickle.UnpicklingError, RuntimeError)):
        TrainingState.from_bytes(pickle.dumps(_RunsAShellCommand(str(marker))), "here")
    assert not marker.exists()


@pytest.mark.job
def test_a_finished_run_reruns_unchanged_then_resumes_past_a_planted_and_a_truncated_checkpoint(jobs, tmp_path):
    """One finished 1-epoch run (checkpoints 10, 20 and the final 22), three checks on it:

    - a rerun of the finished job reports the same checkpoint and verdict (the promotion gate refuses a `null`
      verdict) and writes no checkpoint again;
    - the attack from the issue: a state.pt that runs a shell command, MANIFEST sha256 made to match, planted in
      place of the newest published checkpoint (run.json names it, so the resume loads it first) ...
    - ... and the next one truncated, as by a crash mid-upload: a run of 2 epochs skips both, like corrupt ones,
      resumes from the step-10 checkpoint, says what it skipped and runs nothing planted."""
    from run_folder_files import read_result

    cfg = jobs.config("planted", epochs=1)
    code, out = jobs.run(cfg)
    assert code == 0, out
    first = jobs.result(cfg)
    # HEALTHY, or DEGRADED (sync-bound) on a loaded host: this tiny model's step is mostly all-reduce.
    assert first.verdict is not None and first.verdict.status in ("HEALTHY", "DEGRADED"), first
    final = jobs.checkpoint_folder(cfg, first.checkpoint) / "MANIFEST.json"
    written = final.read_bytes()

    code, out = jobs.run(cfg)
    assert code == 0, out
    again = jobs.result(cfg)
    assert "already finished" in out
    assert again.succeeded and again.checkpoint == first.checkpoint
    assert again.verdict == first.verdict and again.attempt != first.attempt
    assert final.read_bytes() == written
    starts = [r for r in jobs.health(cfg) if r["type"] == "start"]
    assert len(starts) == 2 and starts[1]["finished_already"] and starts[1]["attempt"] == again.attempt

    published = jobs.checkpoints(cfg)
    newest = published.latest_valid()
    planted, truncated = published.names()[:2]
    assert planted == first.checkpoint == newest.manifest.name
    checkpoints = CheckpointStore(LocalFolderStore(cfg["run_uri"]), prefix=published.prefix_of(planted),
                                  keep_last=None)
    marker = tmp_path / "pwned"
    assert checkpoints.save(newest.step, {STATE_FILE: _planted_state(marker)}, dict(newest.manifest.meta)) == planted
    state = jobs.checkpoint_folder(cfg, truncated) / STATE_FILE
    state.write_bytes(state.read_bytes()[:-100])
    cfg["epochs"] = 2
    code, out = jobs.run(cfg)
    assert code == 0, out
    assert "refused to load" in out and "weights_only" not in out
    assert not marker.exists()
    assert truncated in out  # the warning names what was skipped
    result = read_result(LocalFolderStore(cfg["run_uri"]))
    assert result.succeeded and result.resumed_from == published.names()[2] == "ckpt-000000010"
    assert [s.name for s in result.skipped_checkpoints] == [planted, truncated]
    assert "refused to load" in result.skipped_checkpoints[0].reason


def test_a_host_copy_into_an_earlier_one_writes_over_its_memory_and_holds_the_new_values():
    state = _real_state()
    first = state.host_copy()
    weight = state.model["weight"]
    with torch.no_grad():
        weight.add_(1.0)  # training goes on in place
    second = state.host_copy(into=first)
    assert second.model["weight"].data_ptr() == first.model["weight"].data_ptr()  # the same pages, written over
    assert second.model["weight"].data_ptr() != weight.data_ptr()  # still nothing shared with the live state
    torch.testing.assert_close(second.model["weight"], weight)
    exp_avg = state.optimizer["state"][0]["exp_avg"]
    assert second.optimizer["state"][0]["exp_avg"].data_ptr() == first.optimizer["state"][0]["exp_avg"].data_ptr()
    torch.testing.assert_close(second.optimizer["state"][0]["exp_avg"], exp_avg)


def test_a_host_copy_takes_new_memory_where_the_earlier_one_does_not_fit():
    state = _real_state()
    earlier = TrainingState(model={"weight": torch.zeros(2, 2)}, optimizer={}, cursor=(0, 0), step=0,
                            torch_rng=torch.get_rng_state())
    copy = state.host_copy(into=earlier)
    assert copy.model["weight"].shape == (3, 4) and copy.model["weight"].data_ptr() != earlier.model["weight"].data_ptr()
    torch.testing.assert_close(copy.model["weight"], state.model["weight"])
    torch.testing.assert_close(copy.optimizer["state"], state.optimizer["state"])  # nothing to write over: new


@pytest.mark.parametrize("values, finite", [
    ([1.0, -2.0, 3.0], True),
    ([1.0, float("nan"), 3.0], False),
    ([1.0, float("inf"), 3.0], False),
    ([float("inf"), float("-inf")], False),     # their sum is NaN: still non-finite
    ([3e38, 3e38, 3e38], True),                 # finite values whose sum overflows: checked element by element
    ([3e38, 3e38, float("nan")], False),
])
def test_all_finite_is_exact_however_the_sum_turns_out(values, finite):
    from ringflow.training.rank.training_state import all_finite

    assert all_finite(torch.tensor(values, dtype=torch.float32)) is finite


def test_the_refusal_names_what_was_refused_and_never_suggests_weights_only_false(tmp_path):
    with pytest.raises(UnsafeCheckpoint) as excinfo:
        TrainingState.from_bytes(_planted_state(tmp_path / "pwned"), "s3://b/run/ckpt-000000010/state.pt")
    message = str(excinfo.value)
    assert "weights_only" not in message and "Re-running" not in message
    assert "GLOBAL" in message and "delete that checkpoint" in message


def _decode(loaded):
    return loaded, TrainingState.from_bytes(loaded.files[STATE_FILE], loaded.manifest.name)


def test_a_resume_skips_an_unsafe_newest_checkpoint_like_a_corrupt_one_and_records_why(tmp_path):
    """The newest safe checkpoint is used; the planted one is skipped, runs nothing, and is named with its
    reason, as a corrupt one is (what the worker puts in the result's skipped_checkpoints)."""
    from ringflow.training.formats.checkpoint import CheckpointWarning
    from ringflow.training.formats.run_folder import RunFolder
    from ringflow.training.formats.run_result import RunResult

    store, marker = LocalFolderStore(tmp_path / "run"), tmp_path / "pwned"
    attempt = RunFolder(store).claim("a1")
    checkpoints = CheckpointStore(attempt.store, keep_last=None)
    for step, data in ((10, _real_state().to_bytes()), (20, b"not a torch file"), (30, _planted_state(marker))):
        attempt.publish_checkpoint(checkpoints.save(step, {STATE_FILE: data}, {}), keep_last=None)
    skipped = []
    with pytest.warns(CheckpointWarning):
        loaded, state = RunFolder(store).checkpoints().latest_valid(decode=_decode, skipped=skipped)
    assert loaded.manifest.name == "ckpt-000000010" and state.step == 17 and not marker.exists()
    assert [s.name for s in skipped] == ["ckpt-000000030", "ckpt-000000020"]
    assert "refused to load" in skipped[0].reason
    result = RunResult(status="succeeded", attempt="a1", step=17, epoch=2, world_size=1, checkpoint="c",
                       resumed_from=loaded.manifest.name, skipped_checkpoints=tuple(skipped))
    assert RunResult.from_json(result.to_json()).skipped_checkpoints == tuple(skipped)

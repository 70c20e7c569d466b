"""Users' own training scripts run by `ringflow train` (the job config's `entry`, training/rank/script_rank.py):
the design text's three examples (dags/scripts: PyTorch DDP, Horovod with PyTorch, Keras model.fit under
MultiWorkerMirroredStrategy) train on 2 local workers to a final checkpoint with their eval metrics; a rank
SIGKILLed mid-epoch is retried and resumes sample-exact through the training API (the same parameters as a run
never interrupted; every row of each epoch trained once, on 2 workers and after a resume on 1); a script that
calls none of the API still gets its ranks, liveness and result; a bundle changed after the launch pinned it is
refused before any rank runs it; a rank's NaN loss stops the run at once, even before the first health gather.

Each `ringflow train` runs once, in a module-scoped fixture, and the tests read its run folder."""
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from ringflow.training.formats import exit_codes
from ringflow.training.formats.checkpoint import step_of
from ringflow.training.formats.manifest import load_manifest
from ringflow.training.formats.script_checkpoint import STATE_FILES
from ringflow.training.health.verdict import NONFINITE
from ringflow.training.rank.script_state import load_state
from run_folder_files import read_result
from train_command import run_train
from ringflow.training.store import LocalFolderStore

pytestmark = pytest.mark.job

SCRIPTS = Path(__file__).resolve().parents[2] / "dags" / "scripts"
CRASH_AT = 15  # mid-epoch 0 (22 steps an epoch on 2 workers): resumed from the step-10 checkpoint
CRASH_HOLD = (CRASH_AT, "ckpt-000000010")

# Run beside the DDP example in its bundle: every report() first logs the rows of the batch it reports
# (DatasetShard.row_ids) with the step, epoch, rank and attempt, then the example runs unchanged. Given a step
# and a checkpoint (a run with a crash fault at that step), a fresh attempt's rank 1 reports that step only once
# rank 0 has published that checkpoint: the rank dies in report(), and rank 0's upload of a checkpoint 5 steps
# back may still be in flight on a loaded host (torchrun then ends rank 0 with it: seen once, nothing to resume).
ROW_LOGGER = '''
import json, os, runpy, sys, time

import ringflow.training.api as ringflow
from ringflow.training.formats.run_folder import RunFolder
from ringflow.training.store import LocalFolderStore

log_dir, report, steps = sys.argv[1], ringflow.report, [0]
hold = (int(sys.argv[2]), sys.argv[3]) if len(sys.argv) > 3 else None


def published(run_uri):
    return RunFolder(LocalFolderStore(run_uri)).checkpoints().names()


def logged(metrics, checkpoint=None):
    ctx, shard = ringflow.get_context(), ringflow.get_dataset_shard()
    steps[0] += 1
    if hold and ctx.rank == 1 and ctx.resumed_from is None and steps[0] == hold[0]:
        deadline = time.monotonic() + 60
        while hold[1] not in published(ctx.config.run_uri):
            if time.monotonic() > deadline:
                print(f"row logger: {hold[1]} not published after 60 s", file=sys.stderr, flush=True)
                break
            time.sleep(0.05)
    line = {"attempt": ctx.attempt, "resumed_from": ctx.resumed_from, "n": steps[0], "epoch": shard.cursor.epoch,
            "world_size": ctx.world_size, "rows": shard.row_ids.tolist()}
    with open(os.path.join(log_dir, f"rows-{ctx.attempt}-{ctx.rank}.jsonl"), "a") as fh:
        fh.write(json.dumps(line) + "\\n")
    report(metrics, checkpoint)


ringflow.report = logged
sys.argv = ["train.py"]
runpy.run_path("train.py", run_name="__main__")
'''


def train(jobs, cfg: dict, np: int = 2, *extra: str, name: str | None = None, timeout: float = 240):
    """`ringflow train` on `cfg` (its exit code and output)."""
    path = jobs.root / f"{name or Path(cfg['run_uri']).name}.json"
    path.write_text(json.dumps(cfg))
    return run_train(path, "--np", str(np), "--controller", "gloo", *extra, timeout=timeout)


def script_config(jobs, run: str, folder, **overrides) -> dict:
    entry = overrides.pop("entry", {})
    return jobs.config(run, **{"engine": "ddp"} | overrides) | {"entry": {"script": "train.py", "folder": str(folder)} | entry}


def final_checkpoint(cfg: dict):
    """The final checkpoint result.json names, loaded: (its meta, its script state)."""
    from ringflow.training.formats.run_folder import RunFolder

    result = read_result(LocalFolderStore(cfg["run_uri"]))
    loaded = RunFolder(LocalFolderStore(cfg["run_uri"])).checkpoints().load(result.checkpoint)
    (file,) = [f for f in STATE_FILES if f in loaded.files]
    return loaded.manifest.meta, load_state(file, loaded.files[file], cfg["run_uri"])


@pytest.fixture(scope="module")
def logged_ddp(tmp_path_factory) -> Path:
    """The DDP example's folder with the row logger beside it."""
    folder = tmp_path_factory.mktemp("logged-ddp")
    shutil.copy(SCRIPTS / "ddp_digits" / "train.py", folder / "train.py")
    (folder / "logged.py").write_text(ROW_LOGGER)
    return folder


def logged_run(jobs, logged_ddp, run: str, hold: tuple[int, str] | None = None, **overrides) -> dict:
    """The row-logged DDP example's config; `hold`: (step, checkpoint) rank 1 waits for (ROW_LOGGER)."""
    log_dir = jobs.root / f"{run}-rows"
    log_dir.mkdir()
    args = [str(log_dir), *(map(str, hold) if hold else ())]
    return script_config(jobs, run, logged_ddp, entry={"script": "logged.py", "args": args}, **overrides)


@pytest.fixture(scope="module")
def ddp_run(module_jobs, logged_ddp):
    cfg = logged_run(module_jobs, logged_ddp, "ddp")
    code, out = train(module_jobs, cfg)
    return cfg, code, out


@pytest.fixture(scope="module")
def ddp_retried(module_jobs, logged_ddp):
    """The same run with rank 1 SIGKILLed at step CRASH_AT, retried once by `ringflow train --retries 1`."""
    cfg = logged_run(module_jobs, logged_ddp, "ddp-retried", hold=CRASH_HOLD,
                     faults=[{"kind": "crash", "rank": 1, "step": CRASH_AT}])
    code, out = train(module_jobs, cfg, 2, "--retries", "1")
    return cfg, code, out


@pytest.fixture(scope="module")
def ddp_on_one(module_jobs, logged_ddp):
    """Rank 1 SIGKILLed at step CRASH_AT on 2 workers; then the same run_uri trained on 1 worker, no fault."""
    cfg = logged_run(module_jobs, logged_ddp, "ddp-on-one", hold=CRASH_HOLD)
    crashed = train(module_jobs, cfg | {"faults": [{"kind": "crash", "rank": 1, "step": CRASH_AT}]}, 2,
                    name="ddp-on-one-crash")
    return cfg, crashed, train(module_jobs, cfg, 1)


def rows_log(cfg: dict) -> list[dict]:
    """Every report's row log line of the run, each with its rank."""
    log_dir = Path(cfg["entry"]["args"][0])
    return [json.loads(line) | {"rank": int(path.stem.rpartition("-")[2])}
            for path in sorted(log_dir.glob("rows-*.jsonl")) for line in path.read_text().splitlines()]


def trained_rows(cfg: dict) -> dict[int, list[tuple[int, int]]]:
    """The rows that went into the final model, by epoch: each attempt's up to the checkpoint the next one
    resumed from (what a crash trained past it was lost with it), the last attempt's all."""
    lines = rows_log(cfg)
    resumed_at = {line["attempt"]: step_of(line["resumed_from"]) if line["resumed_from"] else 0 for line in lines}
    attempts = sorted(resumed_at, key=resumed_at.get)  # in the order they ran: each resumed later than the last
    kept = []
    for i, attempt in enumerate(attempts):
        mine = [line for line in lines if line["attempt"] == attempt]
        if i + 1 < len(attempts):
            assert resumed_at[attempts[i + 1]] > resumed_at[attempt], f"attempt {attempts[i + 1]} did not resume"
            mine = [line for line in mine if resumed_at[attempt] + line["n"] <= resumed_at[attempts[i + 1]]]
        kept += mine
    by_epoch: dict[int, list[tuple[int, int]]] = {}
    for line in kept:
        by_epoch.setdefault(line["epoch"], []).extend(tuple(r) for r in line["rows"])
    return by_epoch


@pytest.fixture(scope="module")
def all_rows(digits_manifest) -> list[tuple[int, int]]:
    """(file, row in file) of every training row of the manifest."""
    manifest, _ = load_manifest(digits_manifest)
    return sorted((f, r) for f, p in enumerate(manifest.partitions) for r in range(sum(g.rows for g in p.row_groups)))


def assert_every_row_once(cfg: dict, all_rows, epochs: int = 2) -> None:
    by_epoch = trained_rows(cfg)
    assert sorted(by_epoch) == list(range(epochs))
    for epoch, rows in by_epoch.items():
        assert len(rows) == len(set(rows)), f"epoch {epoch}: {len(rows) - len(set(rows))} rows trained twice"
        assert sorted(rows) == all_rows, f"epoch {epoch}: {len(set(all_rows) - set(rows))} rows never trained"


def assert_succeeded_with_eval(cfg: dict, code: int, out: str, steps: int = 44) -> dict:
    assert code == 0, out[-4000:]
    result = read_result(LocalFolderStore(cfg["run_uri"]))
    assert result.status == "succeeded" and result.script == cfg["entry"]["script"] and result.step == steps, result
    meta, state = final_checkpoint(cfg)
    assert meta["final"] and meta["step"] == steps and meta["verdict"]["status"] == "HEALTHY", meta
    assert set(meta["eval_metrics"]) == {"accuracy", "loss"} and meta["eval_metrics"]["accuracy"] > 0.6, meta
    return state


# -- the design text's examples -------------------------------------------------------------------------------

def test_ddp_example_trains_to_a_final_checkpoint_with_eval_metrics(ddp_run, all_rows):
    cfg, code, out = ddp_run
    state = assert_succeeded_with_eval(cfg, code, out)
    assert set(state) == {"model", "optimizer", "scheduler"}
    assert_every_row_once(cfg, all_rows)  # and the row log itself is right


def test_horovod_example_trains_to_a_final_checkpoint_with_eval_metrics(module_jobs):
    cfg = script_config(module_jobs, "horovod", SCRIPTS / "horovod_digits", engine="horovod", learning_rate=0.02)
    code, out = train(module_jobs, cfg)
    state = assert_succeeded_with_eval(cfg, code, out)
    assert set(state) == {"model", "optimizer"} and "fc1.weight" in state["model"]


@pytest.mark.background  # mostly two workers importing TensorFlow
def test_keras_mwms_example_fits_to_a_final_checkpoint_with_eval_metrics(module_jobs, tf_python):
    cfg = script_config(module_jobs, "keras", SCRIPTS / "keras_mwms", engine="tensorflow", learning_rate=0.05)
    code, out = train(module_jobs, cfg, timeout=300)
    state = assert_succeeded_with_eval(cfg, code, out)
    weights = state["weights"]  # numpy arrays (the TF venv has no torch): kernel and bias of both layers
    assert [w.shape for w in weights] == [(64, 64), (64,), (64, 10), (10,)]
    checkpoints = [c.rpartition("/")[2] for c in json.loads((Path(cfg["run_uri"]) / "run.json").read_text())
                   ["checkpoints"]]
    assert checkpoints[:2] == ["ckpt-000000044", "ckpt-000000022"], checkpoints  # each epoch's end


# -- a SIGKILLed rank's retry resumes sample-exact ------------------------------------------------------------

def test_a_killed_rank_is_retried_and_resumes_to_the_uninterrupted_parameters(ddp_run, ddp_retried, all_rows):
    cfg, code, out = ddp_retried
    assert f"fault: SIGKILL at step {CRASH_AT}" in out and "try 2 of 2" in out, out[-4000:]
    state = assert_succeeded_with_eval(cfg, code, out)
    result = read_result(LocalFolderStore(cfg["run_uri"]))
    assert result.resumed_from == "ckpt-000000010", result
    _, uninterrupted = final_checkpoint(ddp_run[0])
    for name, tensor in uninterrupted["model"].items():
        assert torch.allclose(state["model"][name], tensor), name
    assert_every_row_once(cfg, all_rows)


def test_a_resume_on_one_worker_trains_every_row_of_each_epoch_once(ddp_on_one, all_rows):
    cfg, (crash_code, crash_out), (code, out) = ddp_on_one
    assert crash_code != 0 and f"fault: SIGKILL at step {CRASH_AT}" in crash_out, crash_out[-4000:]
    assert code == 0, out[-4000:]
    result = read_result(LocalFolderStore(cfg["run_uri"]))
    assert result.status == "succeeded" and result.world_size == 1 and result.resumed_from == "ckpt-000000010"
    assert {line["world_size"] for line in rows_log(cfg)} == {1, 2}
    assert_every_row_once(cfg, all_rows)


# -- a script of its own -------------------------------------------------------------------------------------

def test_a_script_without_the_api_gets_ranks_liveness_and_a_result(module_jobs):
    cfg = script_config(module_jobs, "own-loader", SCRIPTS / "own_loader", entry={"args": ["--epochs", "1"]})
    code, out = train(module_jobs, cfg)
    assert code == 0, out[-4000:]
    assert "own_loader: rank 0 of 2" in out and "own_loader: rank 1 of 2" in out, out[-4000:]
    assert "own_loader: rank 0 epoch 0" in out and "epoch 1" not in out  # entry.args reached it
    result = read_result(LocalFolderStore(cfg["run_uri"]))
    assert result.status == "succeeded" and result.checkpoint is None and result.script == "train.py", result
    assert result.step == 0 and result.world_size == 2
    (heartbeat,) = Path(cfg["run_uri"]).glob("attempts/*/heartbeat.json")
    beat = json.loads(heartbeat.read_text())
    assert beat["attempt"] == result.attempt and beat["state"] == "ended", beat


def test_a_bundle_changed_after_the_launch_is_refused_before_any_rank_runs_it(module_jobs, tmp_path):
    from ringflow.training.formats.code_bundle import bundle_key, pack, pin_entry
    from ringflow.training.formats.config import JobConfig

    marker = tmp_path / "ran"
    code_dir = tmp_path / "code"
    code_dir.mkdir()
    (code_dir / "train.py").write_text(f"open({str(marker)!r}, 'w').write('pinned')\n")
    cfg = JobConfig.from_dict(script_config(module_jobs, "swapped", code_dir))
    pinned = pin_entry(cfg, LocalFolderStore(cfg.run_uri))
    (code_dir / "train.py").write_text(f"open({str(marker)!r}, 'w').write('swapped')\n")
    (Path(cfg.run_uri) / bundle_key(pinned.entry.bundle_sha256)).write_bytes(pack(str(code_dir)))
    code, out = train(module_jobs, pinned.to_dict(), name="swapped-pinned")
    # `ringflow train` checks the pinned bundle before it launches anything (code_bundle.pin_entry); each rank
    # checks it again before it runs the script (fetch_bundle: tests/training/formats/test_code_bundle.py).
    assert code == exit_codes.CONFIG, out[-4000:]
    (said,) = out.strip().splitlines()
    assert said.startswith("[ringflow] the code bundle ") and "refused, nothing of it ran" in said, out
    assert not marker.exists() and not (Path(cfg.run_uri) / "attempts").exists()


# -- a NaN loss ------------------------------------------------------------------------------------------------

NAN_SCRIPT = '''
import torch, torch.distributed as dist, torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import ringflow.training.api as ringflow

dist.init_process_group("gloo")
ctx, shard = ringflow.get_context(), ringflow.get_dataset_shard()
model = torch.nn.Linear(shard.schema.num_features, shard.schema.num_outputs)
ddp_model, optimizer = DDP(model), torch.optim.SGD(model.parameters(), lr=0.01)
for epoch in shard.epochs():
    for n, (x, y) in enumerate(shard, 1):
        optimizer.zero_grad()
        loss = F.cross_entropy(ddp_model(x), y)
        loss.backward()
        optimizer.step()
        ringflow.report({"loss": float("nan") if ctx.rank == 1 and n == 3 else loss.item()})
dist.destroy_process_group()
'''


def test_a_nan_loss_on_rank_1_before_the_first_health_gather_ends_the_run_nonfinite_at_once(module_jobs, tmp_path):
    """Rank 1 reports a NaN loss at step 3, before any health step (every 10): it stops with NONFINITE at once,
    making no collective the other rank does not (the gather's own process group is one). Rank 0 fails in the
    all-reduce rank 1 left and writes no result: rank 1's verdict line is what ends the run NONFINITE, not
    retried (health/verdict_line.py)."""
    (tmp_path / "train.py").write_text(NAN_SCRIPT)
    cfg = script_config(module_jobs, "nan", tmp_path, health={"every_steps": 10, "stall_seconds": 120})
    code, out = train(module_jobs, cfg, 2, "--retries", "1", timeout=120)
    assert code == exit_codes.for_verdict(NONFINITE), out[-4000:]
    assert "health verdict NONFINITE: the script reported a NaN/Inf loss at step 3 on rank 1" in out, out[-4000:]
    assert "no next try" in out and out.count("job exited with") == 1, out[-4000:]
    assert "STALLED" not in out, out[-4000:]

"""Real Horovod jobs for the training tests: digits shards, a job config, and `ringflow train` as a process."""
import json
import os
from pathlib import Path

import pytest
import torch

from ringflow.training.formats.run_folder import RunFolder
from run_folder_files import read_health, read_result
from train_command import run_train
from ringflow.training.formats.run_result import RunResult
from ringflow.training.store import LocalFolderStore
from ringflow.training.rank.training_state import STATE_FILE, TrainingState


class JobRunner:
    def __init__(self, manifest: str, root: Path):
        self.manifest, self.root = manifest, root

    def config(self, run: str, **overrides) -> dict:
        cfg = {"manifest_uri": self.manifest, "run_uri": str(self.root / run), "checkpoint": {"every_steps": 10},
               "epochs": 2, "batch_size": 32, "learning_rate": 0.002, "log_every_steps": 5,
               "health": {"every_steps": 1, "checksum_every_steps": 5, "stall_seconds": 60}}
        for key, value in overrides.items():
            cfg[key] = cfg[key] | value if isinstance(value, dict) and isinstance(cfg.get(key), dict) else value
        return cfg

    def run(self, cfg: dict, np: int = 2, controller: str = "gloo", timeout: float = 240, args: tuple = ()):
        """`ringflow train` on `cfg` (`args`: more of its flags): (exit code, output)."""
        path = self.root / f"{Path(cfg['run_uri']).name}-{len(list(self.root.glob('*.json')))}.json"
        path.write_text(json.dumps(cfg))
        return run_train(path, "--np", str(np), "--controller", controller, *args, timeout=timeout)

    @staticmethod
    def result(cfg: dict) -> RunResult:
        """The run's published result (the current attempt's, run_folder.py)."""
        result = read_result(LocalFolderStore(cfg["run_uri"]))
        assert result is not None, f"no result.json in {cfg['run_uri']}"
        return result

    @staticmethod
    def health(cfg: dict) -> list[dict]:
        return read_health(LocalFolderStore(cfg["run_uri"]))

    @staticmethod
    def final_parameters(cfg: dict) -> dict[str, torch.Tensor]:
        loaded = JobRunner.checkpoints(cfg).latest_valid()
        return TrainingState.from_bytes(loaded.files[STATE_FILE], cfg["run_uri"]).model

    @staticmethod
    def checkpoints(cfg: dict):
        """The checkpoints the run folder published (run_folder.py), newest first by names()."""
        return RunFolder(LocalFolderStore(cfg["run_uri"])).checkpoints()

    @staticmethod
    def checkpoint_folder(cfg: dict, name: str) -> Path:
        """Where a published checkpoint's files are on disk."""
        return Path(cfg["run_uri"]) / JobRunner.checkpoints(cfg).prefix_of(name) / name


@pytest.fixture(scope="session")
def job_runner_type() -> type[JobRunner]:
    """JobRunner itself, for module-scoped fixtures that run their jobs once in a folder of their own."""
    return JobRunner


@pytest.fixture
def jobs(digits_manifest, tmp_path) -> JobRunner:
    return JobRunner(digits_manifest, tmp_path)


@pytest.fixture(scope="module")
def module_jobs(digits_manifest, tmp_path_factory) -> JobRunner:
    """Jobs a whole test module shares: built once by a module-scoped fixture, read by several tests."""
    return JobRunner(digits_manifest, tmp_path_factory.mktemp("module-jobs"))


@pytest.fixture(scope="session")
def uninterrupted(digits_manifest, tmp_path_factory):
    """`uninterrupted(engine)`: (config, output) of the one plain 3-epoch, 2-worker run of a torch engine that
    several modules check or compare with (Horovod's learning, DDP's likeness to it, kill-and-resume equality,
    the cross-engine resume), run once, on first use. Nobody writes to it.

    DDP's is started by `ringflow train --engine ddp` on a config that names no engine: the flag is proven on it
    (test_ddp_training.py)."""
    runner = JobRunner(digits_manifest, tmp_path_factory.mktemp("uninterrupted"))
    done: dict[str, tuple[dict, str]] = {}

    def run(engine: str) -> tuple[dict, str]:
        if engine not in done:
            cfg = runner.config(f"uninterrupted-{engine}", epochs=3)
            code, out = runner.run(cfg, args=("--engine", engine) if engine != "horovod" else ())
            assert code == 0, out
            done[engine] = cfg, out
        return done[engine]

    return run


class ProcessJanitor:
    """Ends whatever a test's jobs left, however the test ended: the processes of every job folder under
    `root` (their processes.json), any process whose command line names `root`, and the cgroups of
    `ringflow train` processes run directly (named after their pid: register it with `launcher`)."""

    def __init__(self, root: Path):
        self.root, self.launchers = root, []

    def launcher(self, pid: int) -> None:
        self.launchers.append(pid)

    def clean(self) -> None:
        import signal

        from ringflow.training.core.backends.processes import proc
        from ringflow.training.core.backends.processes.cgroup import CgroupV1Freezer, CgroupV2
        from ringflow.training.core.backends.processes.proc import Process
        from ringflow.training.core.backends.processes.stop import stop_processes
        from ringflow.training.core.backends.processes.tracker import TrackingUnavailable
        from ringflow.training.core.backends.processes.tracking import reopen

        for record in self.root.rglob("processes.json"):
            doc = json.loads(record.read_text())
            tracker, who = reopen(doc["tracking"]), doc["supervisor"]
            supervisor = Process(pid=who["pid"], start=who["start"], ppid=0, state="?")
            stop_processes(tracker, 0, last=[supervisor], kill_wait_seconds=5)
            tracker.release(5.0)
        for p in proc.snapshot():
            if str(self.root) in proc.command_line(p.pid) and p.pid != os.getpid():
                proc.send(p, signal.SIGKILL)
                proc.send(p, signal.SIGCONT)
        for kind in (CgroupV2, CgroupV1Freezer):
            try:
                home = Path(kind.home())
            except TrackingUnavailable:
                continue
            for pid in self.launchers:
                for folder in home.glob(f"ringflow-train-{pid}-*"):
                    tracker = kind(str(folder))
                    stop_processes(tracker, 0, kill_wait_seconds=5)
                    tracker.release(5.0)


@pytest.fixture
def janitor(tmp_path):
    janitor = ProcessJanitor(tmp_path)
    try:
        yield janitor
    finally:
        janitor.clean()


TRACKING_MODES = ("cgroup-v2", "cgroup-v1", "subreaper")


@pytest.fixture(params=TRACKING_MODES)
def tracking_mode(request):
    """Each way of tracking a job's processes (backends/processes/tracking.py) this machine allows."""
    from ringflow.training.core.backends.processes.tracker import TrackingUnavailable
    from ringflow.training.core.backends.processes.tracking import start_tracking

    try:
        with start_tracking("probe", request.param) as tracker:
            tracker.release()
    except TrackingUnavailable as exc:
        pytest.skip(str(exc))
    return request.param

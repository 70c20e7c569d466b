"""Real Horovod jobs for the training tests: digits shards, a job config, and `ringflow train` as a process."""
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ringflow.training.checkpoint import CheckpointStore
from ringflow.training.health.records import read_health
from ringflow.training.store import LocalFolderStore


class JobRunner:
    def __init__(self, manifest: str, root: Path):
        self.manifest, self.root = manifest, root

    def config(self, run: str, **overrides) -> dict:
        cfg = {"manifest_uri": self.manifest, "checkpoint": {"uri": str(self.root / run), "every_steps": 10},
               "epochs": 2, "batch_size": 32, "learning_rate": 0.002, "log_every_steps": 5,
               "health": {"every_steps": 1, "checksum_every_steps": 5, "stall_seconds": 60}}
        for key, value in overrides.items():
            cfg[key] = cfg[key] | value if isinstance(value, dict) and isinstance(cfg.get(key), dict) else value
        return cfg

    def run(self, cfg: dict, np: int = 2, controller: str = "gloo", timeout: float = 240):
        path = self.root / f"{Path(cfg['checkpoint']['uri']).name}-{len(list(self.root.glob('*.json')))}.json"
        path.write_text(json.dumps(cfg))
        proc = subprocess.run([sys.executable, "-m", "ringflow.training.cli", "train", str(path), "--np", str(np),
                               "--controller", controller], capture_output=True, text=True, timeout=timeout,
                              env=os.environ | {"PYTHONUNBUFFERED": "1"})
        return proc.returncode, proc.stdout + proc.stderr

    @staticmethod
    def result(cfg: dict) -> dict:
        return json.loads((Path(cfg["checkpoint"]["uri"]) / "result.json").read_text())

    @staticmethod
    def health(cfg: dict) -> list[dict]:
        return read_health(LocalFolderStore(cfg["checkpoint"]["uri"]))

    @staticmethod
    def final_parameters(cfg: dict) -> dict[str, torch.Tensor]:
        store = CheckpointStore(LocalFolderStore(cfg["checkpoint"]["uri"]))
        loaded = store.latest_valid()
        return torch.load(io.BytesIO(loaded.files["state.pt"]), weights_only=False)["model"]


@pytest.fixture
def jobs(digits_manifest, tmp_path) -> JobRunner:
    return JobRunner(digits_manifest, tmp_path)

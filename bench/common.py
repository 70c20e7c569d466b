"""What several benchmarks repeat, in one place: the environment every bench job runs with, the small model
the throughput benches train and its random shards, spread and quartile formatting, the machine a result
was measured on, a throwaway Airflow home, moto's S3 server, how a bench module is started in another
process, a run folder's result and health records, and the route to the modules the benches share with
tests/."""
from __future__ import annotations

import atexit
import importlib.util
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ringflow.training.formats.run_result import RunResult

REPO = Path(__file__).resolve().parent.parent
TESTS = REPO / "tests"

# The model of the throughput benches (throughput.py, loop_vs_plain.py, health_overhead.py, bind_cores.py):
# MLP FEATURES -> HIDDEN -> CLASSES, BATCH rows per rank per step, ROWS_PER_RANK rows in each rank's partition.
FEATURES, HIDDEN, CLASSES, BATCH = 128, [256, 256], 10, 256
ROWS_PER_RANK = 8192


def importable(env: dict[str, str]) -> dict[str, str]:
    """`env` with the repository root first on PYTHONPATH, so a process it starts (a rank under horovodrun or
    torchrun, a child in a memory cgroup) can run `python -m bench.<name>` whatever its working folder."""
    paths = [str(REPO), *(p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(REPO))]
    return env | {"PYTHONPATH": os.pathsep.join(paths)}


def module_command(module: str, *args: str) -> list[str]:
    """This Python running bench module `module` (e.g. "bench.data_scaling"; `__spec__.name` for one's own);
    run it with an environment from importable()."""
    return [sys.executable, "-m", module, *args]


def environment() -> dict[str, str]:
    """What every job here runs with: the launcher's rank environment, ringflow's Horovod/Open MPI settings
    (a ringflow rank sets them itself from its config; a peer gets them here), one core per rank so np=1
    measures one core and np=2 can reach at most 2.0x, and the bench package importable by the ranks."""
    from ringflow.training.core.launcher import rank_environment
    from ringflow.training.formats.config import HorovodConfig
    from ringflow.training.rank.cores import TORCH_THREADS_ENV

    return importable(rank_environment() | HorovodConfig().environment() | {TORCH_THREADS_ENV: "1"})


def shown_environment() -> dict[str, str]:
    """The settings every job runs with that tune it (environment() less the inherited variables)."""
    return {k: v for k, v in environment().items() if k.startswith(("OMPI_MCA", "HOROVOD", "RINGFLOW", "GLOO"))}


def write_random_shards(folder: Path, *, partitions: int, rows_per_partition: int, features: int, classes: int,
                        batch: int) -> str:
    """Shards of random classification rows: float32 features f0.., an integer target, `partitions`
    partitions of `rows_per_partition` rows each (seeded: the same rows every time), written into `folder` by
    ringflow's own shard step, so the jobs read what a real run reads; the path of their manifest."""
    import numpy as np
    import pandas as pd

    from ringflow.training.core.sharding import write_shards
    from ringflow.training.store import LocalFolderStore

    rng = np.random.default_rng(0)
    frame = pd.DataFrame(rng.standard_normal((rows_per_partition * partitions, features)).astype("float32"),
                         columns=[f"f{i}" for i in range(features)])
    frame["target"] = rng.integers(0, classes, len(frame))
    write_shards(frame, LocalFolderStore(str(folder)), target="target", num_partitions=partitions,
                 batch_size=batch, eval_fraction=0.0)
    return str(folder / "manifest.json")


def shards(root: Path, np_: int) -> str:
    """The small model's shards for an np_-rank job, in root/shards<np_> (where the job configs look)."""
    return write_random_shards(root / f"shards{np_}", partitions=np_, rows_per_partition=ROWS_PER_RANK,
                               features=FEATURES, classes=CLASSES, batch=BATCH)


def spread(values: list[float], digits: int = 2) -> str:
    """median (min–max)."""
    return f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}–{max(values):.{digits}f})"


def quartiles(values: list[float]) -> tuple[float, float, float]:
    """(median, lower quartile, upper quartile)."""
    qs = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    return statistics.median(values), qs[0], qs[2]


def machine() -> dict:
    """What a result was measured on."""
    return {"cpus": os.cpu_count(), "python": sys.version.split()[0], "platform": platform.platform()}


def use_throwaway_airflow_home() -> None:
    """For the benches that import ringflow.operators: Airflow wants a home, and a benchmark should leave none.
    Points AIRFLOW_HOME at a temporary folder removed at exit, unless the caller already set one."""
    if "AIRFLOW_HOME" not in os.environ:
        os.environ["AIRFLOW_HOME"] = tempfile.mkdtemp(prefix="ringflow-bench-airflow-")
        atexit.register(shutil.rmtree, os.environ["AIRFLOW_HOME"], True)


def tests_module(name: str) -> ModuleType:
    """The module tests/<name>.py, which a bench shares with the tests (the memory cgroup, the real-size
    workload, the throttling S3 proxy). They stay in tests/ because the tests are their first users and import
    them as top-level modules (tests/ is not a package: pytest puts it on sys.path through its conftest.py);
    a bench loads the file by its path instead, under the same name, so no search path changes and, inside a
    pytest process, the tests' copy is the one used."""
    if name in sys.modules:
        return sys.modules[name]
    path = TESTS / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or not path.is_file():
        raise ImportError(f"{path} is missing: bench needs the repository's tests/ folder beside bench/")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # before running it: its dataclasses look their module up there
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def read_result(store) -> RunResult | None:
    """The published result of the run folder in `store` (an ObjectStore), through its RunFolder."""
    from ringflow.training.formats.run_folder import RunFolder

    return RunFolder(store).read_result()


def read_health(store) -> list[dict]:
    """All of the visible health records of the run folder in `store` (an ObjectStore), in order."""
    from ringflow.training.formats.run_folder import RunFolder

    return RunFolder(store).read_health()


class Moto:
    """moto's S3 server on 127.0.0.1 (real_sizes.py, promotion.py), and what a job, the shard step and the
    Airflow tasks need to reach it. Stop it with stop(), or use it as a context manager."""

    access_key, secret_key, region = "ringflow-bench", "ringflow-bench-secret", "us-east-1"

    def __init__(self, log: Path):
        from ringflow.training.core.launcher import free_port

        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "MOTO_"))}
        self._log_path, self._log = log, open(log, "wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                                     stdout=self._log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{self.endpoint}/moto-api/data.json", timeout=1):
                    return
            except OSError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    self.stop()
                    raise SystemExit(f"moto's S3 server did not start: {log.read_text()[-2000:]}")
                time.sleep(0.2)

    def env(self) -> dict[str, str]:
        return {"RINGFLOW_S3_ENDPOINT": self.endpoint, "AWS_ACCESS_KEY_ID": self.access_key,
                "AWS_SECRET_ACCESS_KEY": self.secret_key, "AWS_DEFAULT_REGION": self.region}

    def settings(self):
        from ringflow.training.store import S3Settings

        return S3Settings(self.endpoint, self.access_key, self.secret_key, self.region)

    def client(self):
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=self.access_key,
                            aws_secret_access_key=self.secret_key, region_name=self.region)

    def new_bucket(self, name: str) -> str:
        self.client().create_bucket(Bucket=name)
        return name

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)
        self._log.close()

    def __enter__(self) -> "Moto":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

"""Real 2-rank jobs whose ranks record the CPUs each of their threads may run on (the kernel's
Cpus_allowed_list, affinity_recording_model.py): bound, the two ranks' CPUs are disjoint and are the shares
cores.py decides for this host; not bound, every thread may run on every usable CPU. Under horovodrun
(Gloo), torchrun, the MPIJob launcher's own mpirun command (`-bind-to none`), and plain mpirun, which binds
ranks itself and whose binding is kept."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ringflow.training.rank.cores import decide_cpu_share
from ringflow.training.rank.cpu_limits import cpu_quota_cores, host_cpu_count, usable_cpus

pytestmark = pytest.mark.job

HERE = Path(__file__).parent


def expected_shares(bind_cores):
    return [decide_cpu_share(usable_cpus(), cpu_quota_cores(), host_cpu_count(), rank, 2, bind_cores) for rank in (0, 1)]


def recording_config(jobs, tmp_path, name, **settings) -> tuple[dict, Path]:
    out = tmp_path / f"{name}-affinity"
    cfg = jobs.config(name, epochs=1, health={"enabled": False}, **settings,
                      model={"kind": "custom", "factory": "affinity_recording_model:build", "kwargs": {"out": str(out)}})
    return cfg, out


def recorded(out: Path) -> list[dict]:
    """Per local rank: {"cpus": the CPUs its threads may run on, as one set per thread, "torch_threads": n}."""
    ranks = []
    for rank in (0, 1):
        doc = json.loads(Path(f"{out}.{rank}").read_text())
        ranks.append({"cpus": {tuple(cpus) for cpus in doc["threads"].values()}, "threads": len(doc["threads"]),
                      "torch_threads": doc["torch_threads"]})
    return ranks


def with_tests_on_path() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), env.get("PYTHONPATH")]))
    return env


@pytest.mark.parametrize("engine, controller, bind_cores", [
    ("horovod", "gloo", True),
    ("ddp", None, True),
    ("horovod", "mpi", "auto"),  # the default: bound where the job has CPUs of its own (not on a whole host)
])
def test_each_rank_on_its_own_cpus_or_on_all(jobs, tmp_path, monkeypatch, engine, controller, bind_cores):
    shares = expected_shares(bind_cores)
    if bind_cores is True and not all(s.bound for s in shares):
        pytest.skip(f"this host cannot give 2 ranks CPUs of their own: {shares[0].reason}")
    monkeypatch.setenv("PYTHONPATH", with_tests_on_path()["PYTHONPATH"])
    cfg, out = recording_config(jobs, tmp_path, f"{engine}-{bind_cores}", engine=engine, bind_cores=bind_cores)
    code, log = jobs.run(cfg, controller=controller or "gloo")
    assert code == 0, log
    ranks = recorded(out)
    for local_rank, (rank, share) in enumerate(zip(ranks, shares)):
        # Every thread: the training thread, Liveness, Horovod's or Gloo's, MPI's, pyarrow's.
        assert rank["threads"] >= 3 and rank["cpus"] == {share.cpus}, (rank, share)
        assert rank["torch_threads"] == share.threads
        assert f"[ringflow] {share.describe(local_rank, 2)}" in log
    if all(s.bound for s in shares):
        assert not set(shares[0].cpus) & set(shares[1].cpus)
    else:
        assert all(rank["cpus"] == {tuple(sorted(usable_cpus()))} for rank in ranks)


def mpijob_launcher_command(cfg: dict, path: Path) -> list[str]:
    """The MPIJob launcher's mpirun command line (`-bind-to none`), on this host instead of its hostfile."""
    from ringflow.training.core.backends.job_spec import JobSpec
    from ringflow.training.core.backends.kubernetes.mpijob import MPIJobSettings, mpirun_command

    command = mpirun_command(JobSpec(name="bind", config=cfg, num_workers=2),
                             MPIJobSettings(image="local/ringflow-training:test", run_as_root=True, python=sys.executable))
    assert "-bind-to" in command and command[command.index("-bind-to") + 1] == "none"
    return command[:3] + ["-H", "localhost:2"] + command[3:-1] + [str(path)]


def plain_mpirun_command(cfg: dict, path: Path) -> list[str]:
    """mpirun as a user might type it: it binds each of up to 2 ranks to a core of its own."""
    return ["mpirun", "--allow-run-as-root", "-np", "2", "-H", "localhost:2", sys.executable, "-m",
            "ringflow.training", str(path)]


@pytest.mark.parametrize("launch, kept", [(mpijob_launcher_command, False), (plain_mpirun_command, True)])
def test_mpirun(jobs, tmp_path, launch, kept):
    shares = expected_shares(True)
    if not all(s.bound for s in shares):
        pytest.skip(f"this host cannot give 2 ranks CPUs of their own: {shares[0].reason}")
    cfg, out = recording_config(jobs, tmp_path, launch.__name__, bind_cores=True)
    path = tmp_path / f"{launch.__name__}.json"
    path.write_text(json.dumps(cfg))
    env = {k: v for k, v in with_tests_on_path().items() if not k.startswith(("HOROVOD_", "OMPI_MCA_"))}
    env.setdefault("LD_LIBRARY_PATH", "")  # forwarded with -x, so it must exist (the image sets it)
    proc = subprocess.run(launch(cfg, path), capture_output=True, text=True, timeout=240, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ranks = recorded(out)
    assert all(len(rank["cpus"]) == 1 for rank in ranks)  # every thread of a rank alike
    cpus = [next(iter(rank["cpus"])) for rank in ranks]
    assert not set(cpus[0]) & set(cpus[1])
    if kept:  # mpirun's own core a rank, and ringflow says it kept it
        assert proc.stdout.count("the launcher bound this rank to its CPUs") == 2, proc.stdout
    else:
        assert cpus == [s.cpus for s in shares] and proc.stdout.count(": bound to CPUs") == 2, proc.stdout


def test_a_rank_no_launcher_placed_takes_its_local_rank_from_horovod(tmp_path):
    """Started without horovodrun or mpirun, no variable names its local rank: the engine decides after
    hvd.init() (a world of one), when Horovod knows it."""
    code = ("import json, os, torch\n"
            "from ringflow.training.formats.config import JobConfig\n"
            "from ringflow.training.rank.engines.horovod import HorovodEngine\n"
            "engine = HorovodEngine.start(JobConfig.from_dict({'manifest_uri': '/m/manifest.json', 'run_uri': '/r', "
            "'bind_cores': True}))\n"
            "print(json.dumps({'size': engine.size, 'torch_threads': torch.get_num_threads()}))\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HOROVOD_", "OMPI_", "RINGFLOW_TORCH_THREADS"))}
    env |= {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    share = decide_cpu_share(usable_cpus(), cpu_quota_cores(), host_cpu_count(), 0, 1, True)
    assert f"[ringflow] {share.describe(0, 1)}" in proc.stdout
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"size": 1, "torch_threads": share.threads}

"""The MPIJob path across hosts, in the real training image: the launcher's mpirun (exactly what
build_mpijob generates) reaches the workers' sshd over ssh on port 2222 as mpiuser, with the MPI
Operator's hostfile, environment and keys; the hosts are network namespaces running the image's root.

- training across 2 hosts (1 slot each) ends with the same parameters as a single-host run;
- cutting one worker's link mid-run gives STALLED within stall_seconds, the job is stopped and nothing is
  left running on any host;
- a retry after the link is back resumes from the last checkpoint and ends like the uninterrupted run;
- rank 0's host frozen and cut off from the launcher but not from the store (a node gone dark whose pod
  outlives its MPIJob): the retry, a new MPIJob on other hosts, claims the run folder and succeeds; when the
  old host comes back, its rank 0 ends FENCED without writing anything;
- with `elastic`, the launcher runs Horovod's elastic driver over the operator's discovery script: a rank
  SIGKILLed on its host is recovered inside the job and a new worker joins on that host, every row once.
"""
from __future__ import annotations

import io
import os
import time
from pathlib import Path

import pytest

from ringflow.training.formats.run_folder import RunFolder
from run_folder_files import read_result
from ringflow.training.store import LocalFolderStore

import mpi_operator as op
from hosts import STORE_MOUNT, Cluster
from mpijob_hosts import MPIJobOnHosts, write_json

# own_lane: in the third lane (scripts/test.sh), before the real-size test, not beside the background lane's
# Airflow and TensorFlow tests: there, once, a retry's rank waited out start-up's 60 s in its rendezvous.
pytestmark = [pytest.mark.service, pytest.mark.background, pytest.mark.own_lane]

JOB = "rf-multihost"
NAMESPACE = "ringflow"
WORKERS = 2
STALL_SECONDS = 20
# Long enough that a link can be cut after a few checkpoints, short enough for CI (digits: 22 steps/epoch).
EPOCHS = 12
CHECKPOINT_EVERY = 20
# Ranks share a host's cores (worker.start_horovod: cores // local ranks), so one rank per host would use
# twice the threads of a single-host run, and a different summation order in the matrix products (measured:
# parameters 1e-7 apart). One thread per rank in both makes them comparable bit for bit.
RANK_ENV = {"RINGFLOW_TORCH_THREADS": "1"}
# What the outside watcher may add to stall_seconds: its 1 s poll and the health log's 1 s flush.
WATCHER_SLACK = 5.0


def job_config(run: str) -> dict:
    return {"manifest_uri": f"{STORE_MOUNT}/shards/manifest.json",
            "run_uri": f"{STORE_MOUNT}/runs/{run}", "checkpoint": {"every_steps": CHECKPOINT_EVERY, "keep_last": 3},
            "epochs": EPOCHS, "batch_size": 32, "learning_rate": 0.002, "seed": 0, "log_every_steps": 20,
            "health": {"every_steps": 5, "checksum_every_steps": 20, "stall_seconds": STALL_SECONDS}}


def host_path(cluster: Cluster, uri: str) -> Path:
    """Where a path under the pods' /srv/ringflow is on this machine."""
    return cluster.store / Path(uri).relative_to(STORE_MOUNT)


def final_parameters(run_dir: Path) -> dict:
    import torch

    loaded = RunFolder(LocalFolderStore(str(run_dir))).checkpoints().latest_valid()
    assert loaded is not None, f"no valid checkpoint in {run_dir}"
    (state,) = [data for name, data in loaded.files.items() if name.endswith(".pt")]
    return torch.load(io.BytesIO(state), weights_only=True, map_location="cpu")["model"]


def assert_same_parameters(a: dict, b: dict) -> None:
    import torch

    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), f"parameter {name} differs: max |diff| {(a[name] - b[name]).abs().max()}"


def assert_every_row_once_here(cluster: Cluster, config: dict, changes: list[dict]) -> None:
    """elastic_rows.assert_every_row_once on the pods' row logs and manifest, read where they are on this machine."""
    from elastic_rows import assert_every_row_once

    assert_every_row_once(config | {"manifest_uri": str(host_path(cluster, config["manifest_uri"])),
                                    "row_log_dir": str(host_path(cluster, config["row_log_dir"]))}, changes)


def tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.splitlines()[-lines:])


@pytest.fixture(scope="module")
def cluster(image_root, tmp_path_factory):
    """A launcher and two workers on one switch, digits sharded into the shared store."""
    workdir = tmp_path_factory.mktemp("multihost")
    workdir.chmod(0o755)
    with Cluster(image_root, workdir) as c:
        c.add_host(op.launcher_hostname(JOB))
        for i in range(WORKERS):
            c.add_host(op.worker_hostname(JOB, i), [op.worker_fqdn(JOB, i, NAMESPACE)])
        shard = c.hosts[0].run(["ringflow", "shard", "builtin:digits", f"{STORE_MOUNT}/shards",
                                "--partitions", str(WORKERS), "--batch-size", "32", "--target", "target"], timeout=300)
        assert shard.returncode == 0, shard.stdout + shard.stderr
        yield c


@pytest.fixture
def mpijob(cluster, training_image, tmp_path):
    """Makes the MPIJob objects for a config; every pod is deleted when the test ends, passed or not."""
    from ringflow.training.core.backends.job_spec import JobSpec
    from ringflow.training.core.backends.kubernetes.settings import MPIJobSettings

    made: list[MPIJobOnHosts] = []

    def make(config: dict, attempt: int = 1) -> MPIJobOnHosts:
        spec = JobSpec(name=JOB, config=config, num_workers=WORKERS, env=RANK_ENV)
        settings = MPIJobSettings(image=training_image, namespace=NAMESPACE)
        # This job's pods by name: a test before may have added hosts of its own (the fenced retry's).
        hosts = {h.name: h for h in cluster.hosts}
        job = MPIJobOnHosts(cluster, hosts[op.launcher_hostname(JOB)],
                            [hosts[op.worker_hostname(JOB, i)] for i in range(WORKERS)], spec, settings,
                            tmp_path / f"attempt-{attempt}")
        made.append(job)
        return job

    yield make
    for job in made:
        job.delete()
    for host in cluster.hosts:
        host.set_link(True)


@pytest.fixture(scope="module")
def single_host_parameters(cluster):
    """The same config trained by `ringflow train --np 2` on one host (horovodrun, no ssh)."""
    config = job_config("single-host")
    write_json(cluster.store / "configs/single-host.json", config)
    proc = cluster.hosts[0].run(["ringflow", "train", f"{STORE_MOUNT}/configs/single-host.json", "--np", str(WORKERS)],
                                env=RANK_ENV, timeout=600)
    assert proc.returncode == 0, tail(proc.stdout + proc.stderr)
    return final_parameters(host_path(cluster, config["run_uri"]))


def test_the_launcher_runs_what_build_mpijob_generates(mpijob):
    from ringflow.training.core.backends.kubernetes.mpijob import mpirun_command

    job = mpijob(job_config("argv"))
    assert job.launcher_argv == mpirun_command(job.spec, job.settings)
    assert job.launcher_argv[:3] == ["mpirun", "-np", str(WORKERS)]
    assert job.launcher_env["OMPI_MCA_orte_default_hostfile"] == op.HOSTFILE
    assert (job.mpi_dir / "hostfile").read_text() == (
        f"{JOB}-worker-0.{JOB}-worker.{NAMESPACE}.svc slots=1\n{JOB}-worker-1.{JOB}-worker.{NAMESPACE}.svc slots=1\n")


def test_training_across_hosts_ends_like_a_single_host_run(cluster, mpijob, single_host_parameters):
    config = job_config("across")
    job = mpijob(config)
    rc, log = job.run(timeout=600)
    assert rc == 0, f"mpirun exited {rc}:\n{tail(log)}"
    result = read_result(LocalFolderStore(str(host_path(cluster, config["run_uri"]))))
    assert result.succeeded and result.world_size == WORKERS, result
    # Both ranks ran on the workers, reached over ssh as mpiuser.
    for i in range(WORKERS):
        assert "Accepted publickey for mpiuser" in job.worker_log(i).read_text(), job.worker_log(i).read_text()
    assert_same_parameters(final_parameters(host_path(cluster, config["run_uri"])), single_host_parameters)


def _newest_checkpoint_step(run_dir: Path) -> int:
    """The step of the newest checkpoint the run folder published (-1: none yet)."""
    names = RunFolder(LocalFolderStore(str(run_dir))).checkpoints().names() if (run_dir / "run.json").exists() else []
    return max((int(n.split("-")[1]) for n in names), default=-1)


def start_and_wait_for_checkpoints(job, run_dir: Path):
    """Start the job's pods and return its launcher once two checkpoints are published, the job still running."""
    job.start_workers()
    launcher = job.start_launcher()
    deadline = time.monotonic() + 300
    while _newest_checkpoint_step(run_dir) < 2 * CHECKPOINT_EVERY:
        assert launcher.poll() is None, f"the job ended too soon:\n{tail(job.launcher_log.read_text())}"
        assert time.monotonic() < deadline, tail(job.launcher_log.read_text())
        time.sleep(0.2)
    return launcher


def _ranks(host) -> list[str]:
    """The training processes (ranks) on a host; not mpirun, whose command line names them too."""
    return [cmd for cmd in host.process_names()
            if cmd.split()[:1] and cmd.split()[0].rsplit("/", 1)[-1].startswith("python") and "ringflow.training" in cmd]


def test_a_cut_link_stalls_stops_everything_and_a_retry_resumes(cluster, mpijob, single_host_parameters):
    from ringflow.training.formats.checkpoint import step_of
    from ringflow.training.core.runs.health_watch import read_verdict

    config = job_config("cut")
    run_dir = host_path(cluster, config["run_uri"])
    job = mpijob(config, attempt=1)
    launcher = start_and_wait_for_checkpoints(job, run_dir)  # cut worker 1 off once two checkpoints are out
    cut_worker = job.workers[1]
    cut_worker.set_link(False)
    cut_at = time.time()

    # The outside watcher (the Airflow trigger's read_verdict) polls the run folder every second.
    verdict = None
    while time.time() - cut_at < STALL_SECONDS + 3 * WATCHER_SLACK:
        verdict = read_verdict(LocalFolderStore(str(run_dir)), config["health"], now=time.time())
        if verdict and verdict["status"] == "STALLED":
            break
        time.sleep(1.0)
    stalled_after = time.time() - cut_at
    assert verdict and verdict["status"] == "STALLED", (verdict, tail(job.launcher_log.read_text()))
    assert stalled_after <= STALL_SECONDS + WATCHER_SLACK, f"STALLED {stalled_after:.1f}s after the cut"
    print(f"STALLED {stalled_after:.1f}s after the link was cut (stall_seconds={STALL_SECONDS}): {verdict['reason']}")

    # The in-job watchdogs end every rank on their own (rank 0 at once, the others after 5 s) ...
    deadline = time.monotonic() + 10
    while any(_ranks(host) for host in job.hosts()) and time.monotonic() < deadline:
        time.sleep(0.5)
    for host in job.hosts():
        assert not _ranks(host), f"training processes left on {host.name}: {host.process_names()}"
    # ... but mpirun does not end while a worker is unreachable: it waits for that worker's orted (measured:
    # still running 36 s after the cut, with "Per user-direction, the job has been aborted" printed). So
    # the job ends only when the watcher deletes it.
    print(f"launcher still running after STALLED: {launcher.poll() is None}")
    # On a fatal verdict the trigger deletes the MPIJob: every pod ends, nothing is left on any host.
    job.delete()
    for host in job.hosts():
        assert host.pids() == [], f"still running on {host.name}: {host.process_names()}"
    resume_step = _newest_checkpoint_step(run_dir)
    assert resume_step >= 2 * CHECKPOINT_EVERY

    # The retry: the link is back, new pods, the same config and run folder.
    cut_worker.set_link(True)
    retry = mpijob(config, attempt=2)
    rc, log = retry.run(timeout=600)
    assert rc == 0, f"the retry's mpirun exited {rc}:\n{tail(log)}"
    result = read_result(LocalFolderStore(str(run_dir)))
    assert result.succeeded, result
    assert step_of(result.resumed_from) == resume_step, result
    # The watcher judges the retry on its own records, not on the first attempt's stall.
    assert read_verdict(LocalFolderStore(str(run_dir)), config["health"],
                        now=time.time())["status"] in ("HEALTHY", "DEGRADED")
    # Sample-exact resume: the interrupted-and-retried run ends where the uninterrupted one does.
    assert_same_parameters(final_parameters(run_dir), single_host_parameters)


def test_a_host_cut_off_from_the_launcher_but_not_from_the_store_ends_fenced(cluster, mpijob, training_image, tmp_path):
    """Rank 0's host goes dark: frozen and cut off from the launcher, its pod never deleted (the node cannot be
    reached), while the store (a folder every host mounts) stays reachable. The retry is a new MPIJob on other
    hosts; it claims the run folder, resumes and succeeds. When the dark host comes back its rank 0 finds the
    run folder claimed by a newer attempt and ends FENCED: nothing anyone reads changes, and its own heartbeat
    is not even written again."""
    import signal

    from ringflow.training.core.backends.job_spec import JobSpec
    from ringflow.training.core.backends.kubernetes.settings import MPIJobSettings
    from ringflow.training.health.heartbeat import read_heartbeat
    from run_folder_files import read_health
    from ringflow.training.core.runs.health_watch import read_verdict

    config = job_config("dark")
    run_dir = host_path(cluster, config["run_uri"])
    run = LocalFolderStore(str(run_dir))
    job = mpijob(config, attempt=1)
    start_and_wait_for_checkpoints(job, run_dir)
    dark = job.workers[0]  # rank 0's host
    frozen = dark.pids()
    for pid in frozen:
        os.kill(pid, signal.SIGSTOP)
    dark.set_link(False)
    old_attempt = RunFolder(run).pointer()[0].attempt
    beat_before = read_heartbeat(run.child(old_attempt.prefix))
    try:
        verdict = None
        deadline = time.monotonic() + STALL_SECONDS + 3 * WATCHER_SLACK
        while time.monotonic() < deadline and not (verdict and verdict["status"] == "STALLED"):
            verdict = read_verdict(run, config["health"], now=time.time())
            time.sleep(1.0)
        assert verdict and verdict["status"] == "STALLED", verdict
        # The trigger deletes the MPIJob: the pods it can reach end; the dark host's pod lives on.
        for host in (job.launcher, job.workers[1]):
            host.kill_all()

        # The retry: a new MPIJob (its own name, so its own pods) on hosts of its own.
        retry_name = f"{JOB}-t2"
        if not any(h.name == op.launcher_hostname(retry_name) for h in cluster.hosts):
            cluster.add_host(op.launcher_hostname(retry_name))
            for i in range(WORKERS):
                cluster.add_host(op.worker_hostname(retry_name, i), [op.worker_fqdn(retry_name, i, NAMESPACE)])
        hosts = {h.name: h for h in cluster.hosts}
        spec = JobSpec(name=retry_name, config=config, num_workers=WORKERS, env=RANK_ENV)
        retry = MPIJobOnHosts(cluster, hosts[op.launcher_hostname(retry_name)],
                              [hosts[op.worker_hostname(retry_name, i)] for i in range(WORKERS)], spec,
                              MPIJobSettings(image=training_image, namespace=NAMESPACE), tmp_path / "retry")
        rc, log = retry.run(timeout=600)
        assert rc == 0, f"the retry's mpirun exited {rc}:\n{tail(log)}"
        result = read_result(run)
        assert result.succeeded and result.attempt != old_attempt.id and result.resumed_from, result
        before = (result.to_dict(), RunFolder(run).checkpoints().names(), read_health(run))

        # The dark host comes back.
        dark.set_link(True)
        for pid in frozen:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and _ranks(dark):
            time.sleep(0.5)
        assert not _ranks(dark), f"rank 0 of the old attempt still runs: {dark.process_names()}"
        after = (read_result(run).to_dict(), RunFolder(run).checkpoints().names(), read_health(run))
        assert after == before  # no visible write
        assert read_heartbeat(run.child(old_attempt.prefix)) == beat_before  # and not even its own heartbeat
    finally:
        for pid in frozen:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        dark.set_link(True)
        dark.kill_all()
    assert dark.pids() == [], dark.process_names()


def test_an_elastic_mpijob_goes_on_without_a_dead_worker_and_takes_it_back(cluster, mpijob):
    """`elastic` on an MPIJob: the launcher runs Horovod's elastic driver over the worker pods the operator's
    discover_hosts.sh lists, started over ssh. Rank 1's process is SIGKILLed mid-epoch on its host: rank 0 goes
    back to its last commit and trains on alone, then, after the cooldown, the driver starts a new worker on the
    dead one's host (its pod still Running) and it joins. One launcher run, no retry; every training row of
    every epoch is trained on exactly once."""
    killed_at = 30  # mid-epoch 1: 22 steps an epoch on 2 workers
    # A wider MLP than digits needs (1.1 M parameters), so that the survivor still trains when the new worker,
    # started over ssh after the cooldown, has imported torch and joins (digits' own MLP ends within seconds).
    config = job_config("elastic") | {
        "epochs": 40, "model": {"hidden": [1024, 1024]}, "checkpoint": {"every_steps": 200},
        "elastic": {"min_workers": 1, "commit_every_steps": 5, "rejoin_seconds": 2},
        "faults": [{"kind": "crash", "rank": 1, "step": killed_at}],
        "row_log_dir": f"{STORE_MOUNT}/rows/elastic"}
    job = mpijob(config)
    assert job.launcher_argv[:4] == ["horovodrun", "-np", str(WORKERS), "--gloo"], job.launcher_argv
    rc, log = job.run(timeout=600)
    assert rc == 0 and f"fault: SIGKILL at step {killed_at}" in log, f"horovodrun exited {rc}:\n{tail(log, 80)}"
    run_dir = host_path(cluster, config["run_uri"])
    result = read_result(LocalFolderStore(str(run_dir)))
    assert result.succeeded and result.resumed_from is None and result.world_size == WORKERS, result
    left, joined = result.membership_changes
    assert (left["why"], left["from_world_size"], left["to_world_size"]) == ("left", 2, 1), left
    assert (joined["why"], joined["from_world_size"], joined["to_world_size"]) == ("joined", 1, 2), joined
    # Who: the dead rank's pod (the driver numbers ranks its own way: rank 1 may run on either), and the rank
    # that joined ran on that same pod.
    fqdns = [op.worker_fqdn(JOB, i, NAMESPACE) for i in range(WORKERS)]
    (gone,) = left["left"]
    assert joined["joined"] == left["left"] and gone.split(":")[0] in fqdns, (left, joined)
    assert "workers changed (left" in log and "workers changed (joined" in log, tail(log, 80)
    # Reached over ssh as mpiuser: on every pod once for the driver's interface probe and once for its rank, and
    # on the dead rank's pod a third time, for the rank that joined.
    accepted = [job.worker_log(i).read_text().count("Accepted publickey for mpiuser") for i in range(WORKERS)]
    assert accepted[fqdns.index(gone.split(":")[0])] == 3 and sorted(accepted) == [2, 3], accepted
    assert_every_row_once_here(cluster, config, [left, joined])


@pytest.mark.parametrize("fault, rank0_changed", [
    ({"kind": "crash_in_commit", "rank": 1, "step": 10}, False),
    ({"kind": "crash_in_upload", "rank": 0, "step": 10}, True),
], ids=["in-a-commit", "rank-0-in-an-upload"])
def test_an_elastic_mpijob_recovers_from_a_death_in_a_commit_or_an_upload(cluster, mpijob, fault, rank0_changed):
    """The deaths a commit and an upload make harder, across hosts: a rank SIGKILLed inside the commit of step 10
    (the survivor goes back to that very commit, nothing redone), and rank 0, the run folder's writer,
    SIGKILLed with its checkpoint of step 10 half written (the survivor on the other host becomes rank 0,
    claims the run folder, and its checkpoints are the valid ones). One launcher run each; every row once."""
    run = f"elastic-{fault['kind']}"
    config = job_config(run) | {
        "epochs": 3, "checkpoint": {"every_steps": 10},
        "elastic": {"min_workers": 1, "commit_every_steps": 5}, "faults": [fault],
        "row_log_dir": f"{STORE_MOUNT}/rows/{run}"}
    rc, log = mpijob(config).run(timeout=600)
    assert rc == 0 and "fault: SIGKILL in the" in log, f"horovodrun exited {rc}:\n{tail(log, 80)}"
    run_store = LocalFolderStore(str(host_path(cluster, config["run_uri"])))
    result = read_result(run_store)
    assert result.succeeded and result.resumed_from is None, result
    (change,) = result.membership_changes
    assert (change["why"], change["from_world_size"], change["to_world_size"], change["rank0_changed"]) == (
        "left", 2, 1, rank0_changed), change
    if fault["kind"] == "crash_in_commit":
        assert (change["commit_step"], change["steps_redone"]) == (10, 0), change
    else:  # the upload runs beside training: the survivor may have committed step 15 before the kill came
        assert change["commit_step"] >= 10, change
        newest = RunFolder(run_store).checkpoints().latest_valid()
        assert newest.manifest.step > 10 and newest.manifest.meta.get("final"), newest.manifest
    assert_every_row_once_here(cluster, config, [change])

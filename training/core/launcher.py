"""Start a training job on this machine and report its exit status: horovodrun (Gloo or MPI controller) for
the Horovod engine, torchrun (c10d rendezvous on 127.0.0.1) for the DDP engine, and for the TensorFlow engine
ringflow itself: one process per worker, started with the TF venv's interpreter and its own TF_CONFIG
(workers on 127.0.0.1 ports chosen here)."""
from __future__ import annotations

import contextlib
import os
import queue
import shutil
import signal
import socket
import subprocess
import tempfile
import sys
import threading
import uuid
from pathlib import Path
from typing import Callable

from .backends.base import JobState
from .backends.processes.stop import (
    KILL_WAIT_SECONDS, ProcessesRemain, grace_from_env, stop_leftovers, stop_processes,
)
from .backends.processes.frozen_watch import FrozenWatch
from .backends.processes.oom_watch import OomWatch
from .backends.processes.supervise import shell_status
from .backends.processes.tracker import RELEASE_WAIT_SECONDS, ProcessTracker
from .backends.processes.tracking import mode_from_env, start_tracking
from ..formats.config import JobConfig
from ..health.oom_advice import JobShape
from ..health.verdict_line import SaidVerdict, verdict_line
from .failure_policy import Decision, Observation, decide
from ..rank.engines import ENGINE_ENV, engine_name
from ..formats.engines import CONTROLLERS, DDP, DEFAULT_CONTROLLER, TABLE, EngineError, engine_spec
from ..formats.tf_config import tf_worker_env
from .preflight import preflight
from .elastic_hosts import elastic_command, too_few_workers
from ..rank.peer_copy import copy_folder, remove as remove_peer_copies
from ..rank.worker_env import ATTEMPT_ENV



def horovodrun_command(config_path: str, num_workers: int, controller: str = DEFAULT_CONTROLLER,
                       python: str = sys.executable) -> list[str]:
    if controller not in CONTROLLERS:
        raise ValueError(f"controller {controller!r}: use one of {CONTROLLERS}")
    horovodrun = shutil.which("horovodrun", path=os.path.dirname(python) + os.pathsep + os.environ.get("PATH", ""))
    if horovodrun is None:
        raise FileNotFoundError("horovodrun not found: run scripts/setup.sh to build Horovod")
    return [horovodrun, "-np", str(num_workers), "-H", f"localhost:{num_workers}", f"--{controller}",
            python, "-m", "ringflow.training", config_path]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on now, for torchrun's rendezvous (the OS picks it; a clash is unlikely)."""
    return free_ports(1, host)[0]


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """`count` distinct TCP ports nobody listens on now: held open together while the OS picks them, so no
    two are the same."""
    socks = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            socks.append(sock)
            sock.bind((host, 0))
        return [sock.getsockname()[1] for sock in socks]
    finally:
        for sock in socks:
            sock.close()


# The TensorFlow engine's venv (scripts/setup.sh makes it inside the Airflow/torch venv, so that venv never
# imports TensorFlow): $RINGFLOW_TF_PYTHON names its interpreter, else $RINGFLOW_TF_VENV its folder.
TF_PYTHON_ENV, TF_VENV_ENV = "RINGFLOW_TF_PYTHON", "RINGFLOW_TF_VENV"


def tensorflow_python(environ: dict[str, str] | None = None, prefix: str = sys.prefix) -> str:
    """The interpreter the TensorFlow engine's workers run with; FileNotFoundError saying how to make it."""
    env = os.environ if environ is None else environ
    python = env.get(TF_PYTHON_ENV) or os.path.join(env.get(TF_VENV_ENV) or os.path.join(prefix, "tensorflow"),
                                                    "bin", "python")
    if not os.path.exists(python):
        raise FileNotFoundError(f"the TensorFlow engine's Python {python} does not exist: run scripts/setup.sh "
                                f"(it makes the TF venv), or set ${TF_PYTHON_ENV} to a Python with tensorflow-cpu "
                                "and ringflow installed")
    return python


def tf_worker_commands(config_path: str, num_workers: int, python: str,
                       ports: list[int] | None = None) -> list[tuple[list[str], dict[str, str]]]:
    """(argv, environment) of each TensorFlow worker of a local job: the rank entry point, its TF_CONFIG
    (formats/tf_config.py) for workers on 127.0.0.1 at `ports` (chosen free when None), and the rank and
    local rank variables torchrun would give (worker_env.py reads the rank before TensorFlow starts;
    engines/tensorflow.py the local one to size its threads)."""
    hosts = [f"127.0.0.1:{port}" for port in (ports or free_ports(num_workers))]
    return [([python, "-m", "ringflow.training", config_path], tf_worker_env(hosts, index, index, num_workers))
            for index in range(num_workers)]


# How many times torchrun restarts every worker of an elastic DDP job within one try (ddp_elastic.py), before
# the job ends and the task's retry resumes it from the store as without elastic.
DDP_ELASTIC_RESTARTS = 3
# A new TCP store for every round of workers: torchrun otherwise shares its rendezvous store with them, and the
# restarted ranks read the dead ranks' Gloo addresses from it (torch 2.13: connectFullMesh "Connection refused").
RESTARTABLE_TORCHRUN_ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}


# torchrun as the local launcher runs it: ranks forked from it with torch and the rank already imported, each
# running FORKED_RANK (`-m ringflow.training CONFIG` there, as python would), rather than an interpreter started
# anew per rank and restart (rank/forked_torchrun.py says why).
FORKED_TORCHRUN = "ringflow.training.rank.forked_torchrun"
FORKED_RANK = Path(__file__).resolve().parents[1] / "rank" / "forked_rank.py"


def torchrun_command(config_path: str, num_workers: int, python: str = sys.executable,
                     port: int | None = None, restarts: int = 0) -> list[str]:
    """torchrun for one host: a c10d rendezvous on 127.0.0.1 at a free port, N ranks, `restarts` restarts.

    Without elastic, none: a failed job is retried by whoever launched it, and resumes from its checkpoint.
    With elastic (DDP_ELASTIC_RESTARTS, rank/ddp_elastic.py), a worker's death makes torchrun stop every
    worker and start them all again at once, in the same try and attempt, and they resume from the newest
    copy of the state a host keeps in memory (rank/peer_copy.py), not from the store. One agent for the
    host's workers (`--nnodes 1`): `--nnodes MIN:MAX` counts agents (hosts), and with one there is nothing
    to shrink to; a restart brings back as many workers.

    Not torchft: it recovers a replica group per step without a restart, but its sampler drops the samples of
    a group that went down (by its own docstring) and it needs a lighthouse server besides the job; ringflow's
    global cursor (rank/stream_deal.py) keeps every sample trained once across a restart on any world size,
    and the accumulation and learning rate are rescaled (rank/world_size_change.py)."""
    endpoint = f"127.0.0.1:{port or free_port()}"
    return [python, "-u", "-m", FORKED_TORCHRUN, "--nnodes", "1", "--nproc-per-node", str(num_workers),
            "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--local-addr", "127.0.0.1",
            "--max-restarts", str(restarts), "--run-path", "--start-method", "fork", str(FORKED_RANK),
            "-m", "ringflow.training", config_path]


# The launcher programs this ringflow has (the engine table's `launcher`), each one's command; torchrun has no
# controller to choose.
LAUNCHER_PROGRAMS: dict[str, Callable[[str, int, str, str], list[str]]] = {
    "horovodrun": horovodrun_command,
    "torchrun": lambda config_path, num_workers, controller, python: torchrun_command(config_path, num_workers,
                                                                                       python),
}


def launch_command(name: str, config_path: str, num_workers: int, controller: str = DEFAULT_CONTROLLER,
                   python: str = sys.executable) -> list[str]:
    """The engine's launcher, as the engine table says (formats/engines.py): horovodrun with `controller`, or
    torchrun (which has no controller to choose)."""
    spec = engine_spec(name)
    if spec.starts_workers_itself:
        raise ValueError(f"engine {name!r} has no launcher program: its workers are started one by one "
                         "(tf_worker_commands, run_local)")
    command = LAUNCHER_PROGRAMS.get(spec.launcher)
    if command is not None:
        return command(config_path, num_workers, controller, python)
    # Never another engine's launcher: an engine whose local launcher is not here is refused by name.
    raise EngineError(f"engine {name!r} has no local launcher in this ringflow (no {spec.launcher!r} here); "
                      "run it as a Kubeflow TrainJob (set $RINGFLOW_TRAINJOB_SETTINGS), or set engine to "
                      + " or ".join(f'"{n}"' for n in local_engines()))


def local_engines() -> tuple[str, ...]:
    """The engines this ringflow can run on this host: a launcher program launch_command has, or workers it
    starts itself (tf_worker_commands)."""
    return tuple(n for n, e in TABLE.items() if e.launcher in LAUNCHER_PROGRAMS or e.starts_workers_itself)


def rank_environment(base: dict[str, str] | None = None) -> dict[str, str]:
    # The Horovod/Open MPI knobs are not here: each rank sets them from the config (engines/horovod.py).
    env = dict(os.environ if base is None else base)
    # OpenMPI refuses root unless told; containers and CI run as root.
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    env.setdefault("PYTHONUNBUFFERED", "1")
    # Gloo (DDP's CPU backend) otherwise binds to the address the host name resolves to; a local job's ranks
    # talk over loopback.
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    return env


def run_local(config_path: str, num_workers: int, controller: str = DEFAULT_CONTROLLER,
              on_line: Callable[[str], None] = lambda line: print(line, flush=True),
              extra_env: dict[str, str] | None = None, engine: str | None = None,
              verify_all_shard_bytes: bool = False) -> int:
    """run_attempt, and the job's exit code (attempt_exit_code)."""
    return attempt_exit_code(run_attempt(config_path, num_workers, controller, on_line, extra_env, engine,
                                         verify_all_shard_bytes))


def run_attempt(config_path: str, num_workers: int, controller: str = DEFAULT_CONTROLLER,
                on_line: Callable[[str], None] = lambda line: print(line, flush=True),
                extra_env: dict[str, str] | None = None, engine: str | None = None,
                verify_all_shard_bytes: bool = False) -> Observation:
    """Preflight, start the engine's launcher with every process it makes tracked as one set, stream its
    output, and return what is known of the ended attempt (the failure policy's Observation: the launcher's
    code, this attempt's result, an OOM seen from outside). engine: overrides the config's `engine` (`ringflow
    train --engine`); None keeps it. verify_all_shard_bytes: the preflight reads every shard byte
    (`--verify-shards`). SIGINT/SIGTERM stop every process of the set; after the launcher ends, any of them still
    running is stopped and named."""
    cfg = preflight(config_path, num_workers, verify_all_shard_bytes, engine=engine)
    engine = engine_name(cfg, engine)
    # A caller that watches the job (the Airflow operator: its job id) names the attempt; else one is made.
    attempt = (extra_env or {}).get(ATTEMPT_ENV) or os.environ.get(ATTEMPT_ENV) or uuid.uuid4().hex
    # Every rank starts the engine its launcher was chosen for, whatever the config says.
    env = rank_environment() | (extra_env or {}) | {ATTEMPT_ENV: attempt, ENGINE_ENV: engine}
    # The launcher's own signal forwarding cannot be trusted with this: horovodrun starts mpirun in a session
    # of its own and Open MPI puts each rank in a process group of its own, so a frozen or wedged mpirun
    # passes nothing on. The tracked set reaches every rank directly (backends/processes).
    grace = grace_from_env()
    tf_workers = None
    if engine_spec(engine).starts_workers_itself:
        try:  # before anything starts: a missing TF venv is one line saying how to make it, not a traceback
            tf_workers = tf_worker_commands(config_path, num_workers, tensorflow_python())
        except FileNotFoundError as exc:
            raise EngineError(str(exc)) from exc
    oom = OomWatch(JobShape.of(cfg, num_workers, engine), lambda: _heartbeat_step(cfg))
    said = SaidVerdict()  # a verdict a rank reached alone (an OOM it caught, a script's NaN on it alone)
    with (start_tracking(f"train-{os.getpid()}", mode_from_env()) as tracker, _StopOnSignal(tracker, grace),
          contextlib.ExitStack() as stack):
        try:
            ended_for: list[str] = []  # an elastic job's reason to end: too few workers (elastic_hosts.py)

            def on_job_line(line: str) -> None:
                oom.feed(line)  # a rank's memory line
                said.feed(line)
                on_line(line)
                too_few = too_few_workers(line, cfg.elastic) if cfg.elastic is not None else None
                if too_few is not None and not ended_for:
                    ended_for.append(too_few)
                    _say(too_few)

            # An elastic job's process the kernel reports stopped is killed once its peers gave up on it.
            frozen = (FrozenWatch(tracker.members, cfg.elastic.peer_timeout_seconds, _say).running()
                      if cfg.elastic is not None else contextlib.nullcontext())
            with oom.running(), frozen:
                if tf_workers is not None:
                    launcher_code = _run_tf_workers(tracker, tf_workers, env, on_job_line, grace)
                else:
                    command = launch_command(engine, config_path, num_workers, controller)
                    if cfg.elastic is not None and engine == DDP:  # torchrun restarts, from the peer copy
                        command = torchrun_command(config_path, num_workers, restarts=DDP_ELASTIC_RESTARTS)
                        env = env | RESTARTABLE_TORCHRUN_ENV
                        stack.callback(remove_peer_copies, copy_folder(cfg.run_uri, attempt))
                    elif cfg.elastic is not None:  # each worker a host of its own (elastic_hosts.py)
                        slots = stack.enter_context(tempfile.TemporaryDirectory(prefix="ringflow-elastic-"))
                        command, slots_env = elastic_command(command, cfg.elastic, num_workers, slots)
                        env = env | slots_env
                    proc = tracker.spawn(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                         text=True, start_new_session=True)
                    assert proc.stdout is not None
                    for line in proc.stdout:
                        on_job_line(line.rstrip("\n"))
                    launcher_code = proc.wait()
            seen = local_observation(launcher_code, _result_of(cfg, attempt), attempt, said.verdict or oom.verdict,
                                     reason=ended_for[0] if ended_for and launcher_code != 0 else "")
        finally:
            stop_leftovers(tracker, grace, _say)
            tracker.release(RELEASE_WAIT_SECONDS)
    return seen


def _run_tf_workers(tracker: ProcessTracker, commands: list[tuple[list[str], dict[str, str]]], env: dict[str, str],
                    on_line: Callable[[str], None], grace: float) -> int:
    """Start every TensorFlow worker in the tracked set, stream their output, and return the job's code the
    way torchrun does: 0 when every worker exited 0, else the first failure's. A worker that fails stops
    the others (SIGTERM, then SIGKILL after `grace`), as horovodrun and torchrun do: its peers would
    otherwise wait in their next collective for a worker that is gone."""
    lines: queue.Queue = queue.Queue()
    procs = []
    for argv, worker_env in commands:
        proc = tracker.spawn(argv, env=env | worker_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             start_new_session=True)
        procs.append(proc)
        threading.Thread(target=_pump, args=(proc, lines), daemon=True, name=f"ringflow-tf-{proc.pid}").start()
    running, failed, stopping = len(procs), None, False
    while running:
        item = lines.get()
        if isinstance(item, str):
            on_line(item)
            continue
        running -= 1
        if item.returncode != 0 and failed is None:
            failed = shell_status(item.returncode)  # a worker killed by signal N: 128 + N, as a shell says
            if running and not stopping:  # its peers are stopped; their output still drains through here
                stopping = True
                _say(f"a TensorFlow worker exited {item.returncode}: stopping the other workers")
                threading.Thread(target=stop_processes, args=(tracker, grace), daemon=True).start()
    return 0 if failed is None else failed


def _pump(proc: subprocess.Popen, lines: queue.Queue) -> None:
    """One worker's output lines into `lines`, then the worker itself once it has exited."""
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.put(line.rstrip("\n"))
    proc.wait()
    lines.put(proc)


class _StopOnSignal:
    """While the job runs, SIGINT (Ctrl-C) or SIGTERM stop every process of the set: SIGTERM, a grace
    period, SIGKILL. The same signal again while that runs kills them at once."""

    def __init__(self, tracker: ProcessTracker, grace_seconds: float):
        self.tracker, self.grace_seconds, self.stopping = tracker, grace_seconds, False

    def __enter__(self) -> "_StopOnSignal":
        self.previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        return self

    def __exit__(self, *exc: object) -> None:
        for s, handler in self.previous.items():
            signal.signal(s, handler)

    def _on_signal(self, signum: int, _frame) -> None:
        if self.stopping:
            self.tracker.kill_all()
            return
        self.stopping = True
        _say(f"{signal.Signals(signum).name}: stopping every process of the job")
        # The output loop resumes once every writer of its pipe is gone, and ends.
        outcome = stop_processes(self.tracker, self.grace_seconds)
        if not outcome.clean:
            _say(f"error: {ProcessesRemain('stopping the job', outcome, KILL_WAIT_SECONDS)}")


def _say(message: str) -> None:
    print(f"[ringflow] {message}", file=sys.stderr, flush=True)


def _result_of(cfg: JobConfig, attempt: str):
    from ..formats.run_folder import RunFolder
    from ..formats.run_result import ResultError

    try:
        return RunFolder.open(cfg.run_uri).read_result(attempt)
    except ResultError as exc:
        print(f"[ringflow] {exc}", file=sys.stderr, flush=True)
        return None


def _heartbeat_step(cfg: JobConfig) -> int | None:
    """The last step rank 0 completed, as its heartbeat or its health records show, whichever is newer (the
    heartbeat is written every few seconds, the records every health.flush_seconds). Read once, after a rank
    was OOM-killed."""
    from ..formats.run_folder import RunFolder

    try:
        folder = RunFolder.open(cfg.run_uri)
        beat = folder.read_heartbeat()
        steps = [r["step"] for r in folder.read_health() if r.get("type") == "step"]
    except Exception:  # noqa: BLE001 - the step is evidence, not a reason to fail the verdict
        return None
    known = [s for s in (beat.step if beat is not None else None, steps[-1] if steps else None) if s is not None]
    return max(known) if known else None


def local_observation(launcher_code: int, result, attempt: str | None = None, verdict=None,
                      reason: str = "") -> Observation:
    """A local attempt as the failure policy sees it: the launcher's code, this attempt's RunResult (None when
    rank 0 wrote none), `verdict`, one a rank said in the log (health/verdict_line.py) or the launcher saw (an
    OOM kill: OomWatch), and `reason`, why the launcher's log says the job ended (an elastic job left with too
    few workers)."""
    state = JobState.SUCCEEDED if launcher_code == 0 else JobState.FAILED
    return Observation(state, launcher_code, reason=reason, result=result, attempt=attempt, verdict=verdict,
                       fatal=verdict is not None)


def attempt_exit_code(seen: Observation, decision: Decision | None = None) -> int:
    """The job's exit status, as the failure policy (core/failure_policy.py) says it (`decision`, decided here
    when not given): horovodrun and torchrun report any rank's failure as 1, and this attempt's RunResult says
    which failure it was. No result of this attempt (killed before rank 0 wrote one): the launcher's own code,
    or the code of the OOM verdict seen outside the ranks, which it then prints for whoever reads its log."""
    decision = decision or decide(seen)
    if seen.verdict is not None and decision.verdict is seen.verdict:
        _say(f"health verdict {seen.verdict.status}: {seen.verdict.reason}")
        print(verdict_line(seen.verdict), file=sys.stderr, flush=True)
    return decision.exit_code

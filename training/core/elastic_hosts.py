"""Where a local elastic Horovod job's workers run: one host name per worker slot, all of them this machine.

Horovod's elastic driver counts a failure against a host NAME and takes the whole host out ("blacklisted"): on
one host listed as `localhost:N`, a single SIGKILLed worker stops every survivor with it. So each slot gets a
name of its own that still resolves to the loopback address (Horovod starts a worker locally, without ssh,
when its host name resolves to an address of this machine: runner/gloo_run.py), and the host-discovery script
ringflow writes lists them at one slot each: a dead worker takes out its own name only. Every worker then
sees itself as local rank 0 of 1 on its host; the slot's index in worker_env.ELASTIC_SLOTS_ENV is its place on this machine.

Pure, but for writing the script: no torch, no Horovod.
"""
from __future__ import annotations

import os
import stat

from ..formats.config import ElasticConfig
from ..rank.worker_env import ELASTIC_SLOTS_ENV


# What Horovod's elastic driver logs when fewer than --min-np slots stayed available for --elastic-timeout, before
# it ends the job (0.28.1, horovod/runner/common/util/timeout.py from driver.py wait_for_available_slots:
# "TimeoutException: Timed out waiting for {activity}. Please check that you have enough resources to run at
# least 2 Horovod processes. Timeout after 3 seconds.", its {activity} left unformatted).
TOO_FEW_SLOTS = "Please check that you have enough resources to run at least"


def too_few_workers(line: str, elastic: ElasticConfig) -> str | None:
    """When `line` is the driver's word that the job ends for want of workers: why, in one sentence (the
    attempt's reason; the retry resumes from the last checkpoint as without elastic). None otherwise."""
    if TOO_FEW_SLOTS not in line:
        return None
    return (f"fewer workers than elastic.min_workers ({elastic.min_workers}) stayed for elastic.wait_seconds "
            f"({elastic.wait_seconds:g} s), and none came back: the job ends here, and a retry resumes from the "
            "last checkpoint")


def slot_names(count: int) -> list[str]:
    """`count` distinct names of the loopback address: 127.0.0.1, then 127.0.1, 127.00.1, ... (inet_aton's
    three-part form; each resolves to 127.0.0.1)."""
    return ["127.0.0.1"] + [f"127.{'0' * k}.1" for k in range(1, count)]


def discovery_script(names: list[str]) -> str:
    """The host-discovery script: each name at one slot."""
    return "#!/bin/sh\n" + "".join(f"echo {name}:1\n" for name in names)


def write_discovery_script(folder: str, names: list[str]) -> str:
    path = os.path.join(folder, "ringflow-hosts.sh")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(discovery_script(names))
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def elastic_arguments(elastic: ElasticConfig, num_workers: int, discovery: str) -> list[str]:
    """horovodrun's elastic options for a launch of `num_workers` (replacing -H): the bounds, the discovery
    script, how long fewer than min_workers may wait for slots, and the rejoin cooldown."""
    fewest, most = elastic.bounds(num_workers)
    args = ["--min-np", str(fewest), "--max-np", str(most), "--host-discovery-script", discovery,
            "--elastic-timeout", str(max(1, round(elastic.wait_seconds)))]
    if elastic.rejoin_seconds is not None:
        seconds = max(1, round(elastic.rejoin_seconds))
        args += ["--blacklist-cooldown-range", str(seconds), str(seconds)]
    return args


def elastic_command(command: list[str], elastic: ElasticConfig, num_workers: int, folder: str) -> tuple[list[str], dict[str, str]]:
    """horovodrun `command` (launcher.horovodrun_command's) made elastic: Gloo (Horovod's elastic mode has no
    MPI controller), the slots from a discovery script written into `folder` instead of -H; and the
    environment every worker needs (ELASTIC_SLOTS_ENV)."""
    names = slot_names(elastic.bounds(num_workers)[1])
    at = command.index("-H")
    rest = [a for a in command[at + 2:] if a not in ("--mpi", "--gloo")]
    elastic_args = elastic_arguments(elastic, num_workers, write_discovery_script(folder, names))
    # The loopback interface: without it horovodrun waits for ever at start on a host with several.
    elastic_args += ["--network-interface", "lo"]
    return command[:at] + ["--gloo", *elastic_args] + rest, {ELASTIC_SLOTS_ENV: ",".join(names)}

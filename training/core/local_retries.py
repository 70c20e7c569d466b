"""`ringflow train --retries N [--remediation auto]`: the train task's tries from a shell. Each try runs on this
machine (launcher.run_attempt) with an attempt id of its own; after it, the failure policy decides and
core/attempts.py says what comes next, as for the train operator: a retry as it was (from the last
checkpoint), one changed by a remedy (recorded in the run folder's remedies.jsonl, its config written to a
file of its own), a wait in the foreground first, or none. Exits with the last try's code."""
from __future__ import annotations

import dataclasses
import json
import os
import sys
import tempfile
import time
import uuid
from typing import Mapping

from ..formats import exit_codes
from ..formats.code_bundle import pin_entry
from ..formats.config import JobConfig, load_job_config
from ..formats.engines import DEFAULT_CONTROLLER, LOCAL
from ..rank.worker_env import ATTEMPT_ENV
from .attempts import Next, next_try
from .failure_policy import decide
from .try_plan import TryPlan, plan_try, recorded


def say(message: str) -> None:
    print(f"[ringflow] {message}", flush=True)


def warn(message: str) -> None:
    print(f"[ringflow] {message}", file=sys.stderr, flush=True)


def attempt_id(try_number: int, environ: Mapping[str, str] | None = None) -> str:
    """The attempt id of try `try_number`: the one the caller named in $RINGFLOW_ATTEMPT_ID (worker_env.ATTEMPT_ENV)
    for the first try, with "-t<N>" for a later one; a new one per try when none was named."""
    named = (os.environ if environ is None else environ).get(ATTEMPT_ENV)
    if not named:
        return uuid.uuid4().hex
    return named if try_number == 1 else f"{named}-t{try_number}"


def train_with_retries(config_path: str, num_workers: int, *, retries: int = 0, remediation: str | None = None,
                       controller: str = DEFAULT_CONTROLLER, engine: str | None = None,
                       verify_all_shard_bytes: bool = False) -> int:
    """Run the job at `config_path` for up to 1 + `retries` tries; `remediation` overrides its config's
    `remediation` (None keeps it). The last try's exit code."""
    from ..formats.run_folder import RunFolder
    from .launcher import attempt_exit_code, run_attempt

    given = load_job_config(config_path)
    # The user's code packed into the run folder and pinned before any try (formats/code_bundle.py): every try
    # runs the same code, and no rank runs code the launch did not name.
    pinned = pin_entry(given, run_folder_store(given.run_uri), os.path.dirname(os.path.abspath(config_path)))
    base = pinned if remediation is None else dataclasses.replace(pinned, remediation=remediation)
    tries, planned = retries + 1, []  # this command's remedies (a remedies.jsonl of an earlier one is not)
    with tempfile.TemporaryDirectory(prefix="ringflow-tries-") as folder:
        try_number = 1
        while True:
            # One try (no --retries): the config runs as given, every fault it names included (the train
            # operator's job is such a try: its config holds that task try's faults and remedies already).
            plan = plan_try(base, try_number, lambda: planned) if tries > 1 else TryPlan(1, base)
            if tries > 1:
                say(f"try {try_number} of {tries}: {_plan_words(plan)}")
            seen = run_attempt(_config_file(plan, given, config_path, folder), num_workers, controller,
                               extra_env={ATTEMPT_ENV: attempt_id(try_number)}, engine=engine,
                               verify_all_shard_bytes=verify_all_shard_bytes)
            decision = decide(seen)
            code = attempt_exit_code(seen, decision)
            say(f"job exited with {code} ({exit_codes.MEANING.get(code, 'failed')})")
            after = next_try(seen, decision, plan.config, plan.planned, try_number, tries, backend_kind=LOCAL,
                             num_workers=num_workers)
            if after.planned is not None and not recorded(RunFolder.open(base.run_uri), after.planned, warn):
                after = next_try(seen, decision, None, (), try_number, tries, backend_kind=LOCAL,
                                 num_workers=num_workers)  # unrecorded, the change would be nobody's to see
            if after.action == Next.FAIL and tries > 1:
                say(f"no next try: {after.reason}")
            if not after.retries:
                return code
            if after.planned is not None:
                planned.append(after.planned)
            if after.wait_seconds > 0:
                say(f"waiting {after.wait_seconds:g}s before try {try_number + 1}: {after.planned.remedy.words}")
                time.sleep(after.wait_seconds)
            try_number += 1


def _plan_words(plan: TryPlan) -> str:
    if plan.own is not None:
        return f"changed after {plan.own.remedy.verdict}: {plan.own.remedy.words}"
    return "as given" if plan.try_number == 1 else "as the try before, from the last checkpoint"


def run_folder_store(run_uri: str):
    from ..store import open_store

    return open_store(run_uri)


def _config_file(plan: TryPlan, given: JobConfig, given_path: str, folder: str) -> str:
    """The given config file when the try runs it as it is; else the try's own config, written in `folder`."""
    if plan.config == given:
        return given_path
    path = os.path.join(folder, f"try-{plan.try_number}.json")
    with open(path, "w") as fh:
        json.dump(plan.config.to_dict(), fh, indent=1)
    return path

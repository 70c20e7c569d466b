"""The suite's tiers: what a test needs to run, one marker each (docs/contributing.md "Tests"; `make test` runs them all).

    pure      nothing outside the test's own process: tables, pure functions, in-process fakes and files
    job       processes of its own: a training job (horovodrun, torchrun, TF workers), a `ringflow` command, a
              Python subprocess, a store double (moto), the Kubernetes emulator, an MLflow server
    pipeline  a whole pipeline: a DAG run by `dag.test()`, or the operators' chain of tries to a promotion
    service   a real service started for it: Airflow's four processes, the browser, the multi-host network
              namespaces, the throttled store at real size

A test names its tier with a marker (its own, else its module's `pytestmark`); one with none is `pure`. A
pure test that starts a process fails, saying which tier to mark it: the tiers stay what they say, so
`pytest -m pure` is the quick run it claims to be.
"""
from __future__ import annotations

import subprocess

import pytest

TIERS = ("pure", "job", "pipeline", "service")
DEFAULT_TIER = "pure"
DESCRIPTIONS = {
    "pure": "nothing outside the test's own process (no subprocess, no server)",
    "job": "processes of its own: a training job, a ringflow command, a subprocess, moto, kmock, an MLflow server",
    "pipeline": "a whole pipeline: a DAG run by dag.test(), or the operators' chain of tries to a promotion",
    "service": "a real service: Airflow's four processes, the browser, the multi-host namespaces, the throttled "
               "store at real size",
}


class TierError(AssertionError):
    """A test did what its tier does not allow."""


def tier_of(marker_names: list[str]) -> str:
    """The tier a test's markers name, closest first (the test's own over its module's `pytestmark`);
    DEFAULT_TIER when they name none."""
    return next((name for name in marker_names if name in TIERS), DEFAULT_TIER)


def register(config) -> None:
    for tier in TIERS:
        config.addinivalue_line("markers", f"{tier}: tier, {DESCRIPTIONS[tier]} (tests/tiers.py)")


def assign(items) -> None:
    """Each test gets the marker of its tier (the default one added), so `-m pure` selects the unmarked too."""
    for item in items:
        tier = tier_of([m.name for m in item.iter_markers()])
        if not item.get_closest_marker(tier):
            item.add_marker(getattr(pytest.mark, tier))


# Popen and its __init__ as this module found them: the guard patches and restores that class, not whatever
# `subprocess.Popen` names while a test's own monkeypatch has replaced it.
_POPEN = subprocess.Popen
_POPEN_INIT = _POPEN.__init__


class _NoProcesses:
    """While a pure test sets up, runs and tears down, starting a process fails with what to mark it instead."""

    def __init__(self, test_id: str) -> None:
        self.test_id = test_id
        self.original = _POPEN_INIT

    def __enter__(self) -> "_NoProcesses":
        test_id = self.test_id

        def refuse(popen, args, *rest, **kwargs):
            raise TierError(f"{test_id} is a pure test (no marker: tests/tiers.py) but started a process "
                            f"{args!r}: mark it job (or the tier it needs)")

        _POPEN.__init__ = refuse  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        _POPEN.__init__ = self.original  # type: ignore[method-assign]


def guard(item):
    """A context manager for a test's whole run (setup, call, teardown): a pure one may start no process;
    others anything."""
    import contextlib

    if item.get_closest_marker(DEFAULT_TIER) is None:
        return contextlib.nullcontext()
    return _NoProcesses(item.nodeid)

"""The tiers (tests/tiers.py): which tier a test's markers name, and a pure test's guard against processes."""
import subprocess
import sys

import pytest

import tiers


@pytest.mark.parametrize("markers, tier", [
    ([], "pure"),
    (["parametrize", "timeout"], "pure"),
    (["job"], "job"),
    (["pipeline", "job"], "pipeline"),  # the test's own marker before its module's
    (["background", "service", "job"], "service"),
])
def test_the_closest_tier_marker_names_the_tier(markers, tier):
    assert tiers.tier_of(markers) == tier


def test_a_guarded_test_that_starts_a_process_fails_naming_the_tier_to_mark(monkeypatch):
    with tiers._NoProcesses("tests/x.py::test_y"):
        with pytest.raises(tiers.TierError, match=r"tests/x.py::test_y is a pure test .*mark it job"):
            subprocess.run([sys.executable, "-c", "pass"])
        # a test that replaces subprocess.Popen itself, undone after the guard ends, leaves no guard behind
        monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: None)
    monkeypatch.undo()
    assert subprocess.Popen.__init__ is tiers._POPEN_INIT

"""The sweep's configurations list, as a table: what a trigger form may give (the selection's tables are in
tests/training/core/test_sweep_selection.py)."""
from __future__ import annotations

import pytest

from ringflow.operators.sweep import checked_configurations
from ringflow.training.formats.config import ConfigError


@pytest.mark.parametrize("value, expect", [
    ([{"learning_rate": 0.01}, {}], [{"learning_rate": 0.01}, {}]),
    ('[{"learning_rate": 0.01}]', [{"learning_rate": 0.01}]),
    ("[{'batch_size': 16, 'model': {'hidden': [8]}}]", [{"batch_size": 16, "model": {"hidden": [8]}}]),
])
def test_checked_configurations(value, expect):
    assert checked_configurations(value) == expect


@pytest.mark.parametrize("value, error, match", [
    ([], ValueError, "non-empty list"),
    ("", ValueError, "neither JSON"),
    ({"learning_rate": 0.01}, ValueError, "non-empty list"),
    ([{"learning_rate": 0.01}, 3], ValueError, "configuration 1"),
    ([{"run_uri": "/elsewhere"}], ConfigError, "run_uri"),
    ([{"manifest_uri": "/other"}], ConfigError, "manifest_uri"),
])
def test_checked_configurations_refuses(value, error, match):
    with pytest.raises(error, match=match):
        checked_configurations(value)

"""Where the MLflow server is, its login, the alias; the environment MLflow's client reads, restored after."""
import os

import pytest

from ringflow.training.core.tracking.settings import (
    DEFAULT_ALIAS, TrackingConfigError, TrackingSettings, check_alias, tracking_env,
)


@pytest.mark.parametrize("kwargs, says", [
    ({"uri": "mlflow.ml.svc:5000"}, "give the server's URL"),
    ({"uri": "file:///tmp/mlruns"}, "give the server's URL"),
    ({"uri": None}, "give the server's URL"),
    ({"uri": "http://h:5000", "username": "u"}, "both username and password"),
    ({"uri": "http://h:5000", "alias": "latest"}, "not 'latest'"),
    ({"uri": "http://h:5000", "alias": "v3"}, "reserves"),
    ({"uri": "http://h:5000", "alias": "has space"}, "letters, digits"),
])
def test_bad_settings_say_what_to_fix(kwargs, says):
    with pytest.raises(TrackingConfigError, match=says):
        TrackingSettings(**kwargs)


@pytest.mark.parametrize("alias", ["champion", "challenger", "prod-eu_1", "v1x"])
def test_good_aliases(alias):
    assert check_alias(alias) == alias


def test_env_is_set_for_the_call_and_restored(monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://before:1")
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "someone-else")
    monkeypatch.delenv("MLFLOW_TRACKING_PASSWORD", raising=False)
    settings = TrackingSettings("https://mlflow.example.com", username="team", password="pw")
    assert settings.alias == DEFAULT_ALIAS == "champion"
    with tracking_env(settings):
        assert os.environ["MLFLOW_TRACKING_URI"] == "https://mlflow.example.com"
        assert (os.environ["MLFLOW_TRACKING_USERNAME"], os.environ["MLFLOW_TRACKING_PASSWORD"]) == ("team", "pw")
    assert os.environ["MLFLOW_TRACKING_URI"] == "http://before:1"
    assert os.environ["MLFLOW_TRACKING_USERNAME"] == "someone-else" and "MLFLOW_TRACKING_PASSWORD" not in os.environ
    with tracking_env(TrackingSettings("http://h:5000")):  # no login: none of another server's leaks in
        assert "MLFLOW_TRACKING_USERNAME" not in os.environ

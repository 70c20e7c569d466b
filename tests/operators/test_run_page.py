"""The run page (operators/run_page.py from core/runs/run_overview.py, served by operators/plugin.py): what it shows
for each state a run folder can be in, that it escapes what it shows, and how it is reached (by key and by task
instance, under the file routes' access rule; an s3:// store through the API server's connection). Opening it in
the Airflow UI's task-instance tab is tests/dags/ui/test_airflow_ui.py's."""
from __future__ import annotations

import base64
import json
import re

import pytest
from fastapi import HTTPException
from fastapi.testclient import TestClient

from ringflow.operators import plugin, run_page
from ringflow.operators.links import RUN_PAGE_ROUTE, TASK_RUN_PAGE_ROUTE, run_page_link
from ringflow.training.core.registry.model_registry import ModelRegistry
from ringflow.training.core.runs import store_layout
from ringflow.training.core.runs.run_overview import MembershipRow, read_overview
from ringflow.training.formats.eval_result import EvalResult
from ringflow.training.formats.run_folder import RunFolder
from ringflow.training.formats.run_result import RunResult
from ringflow.training.health.heartbeat import Heartbeat
from ringflow.training.health.records import HealthLog, record
from ringflow.training.health.verdict import Verdict
from ringflow.training.store import open_store
from run_folder_files import publish_checkpoint

DAG, RUN, GROUP = "ringflow_retrain", "manual__2026-01-01T00:00:00+00:00", "digits"
PNG = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==")


def _key() -> str:
    return store_layout.run_uri("", DAG, RUN, GROUP).strip("/")


def _result(store, status="succeeded", verdict=None, **extra):
    """An attempt's published checkpoint and result.json in the run folder, with optional extra keys."""
    attempt = RunFolder(store).claim("rf-a1")
    ckpt = publish_checkpoint(attempt, 40, {"state.pt": b"w" * 3000}, {}) if status == "succeeded" else None
    result = RunResult(status=status, attempt="rf-a1", step=40, epoch=2, world_size=2, checkpoint=ckpt,
                       verdict=verdict, loss=0.25)
    attempt.publish_result(json.dumps(result.to_dict() | extra).encode())
    return ckpt


def healthy(root):
    store = root.child(_key())
    ckpt = _result(store, verdict=Verdict("HEALTHY", "no problem found in 40 steps"))
    RunFolder(store).write_eval(EvalResult({"accuracy": 0.93, "loss": 0.2}, ckpt, 40, 100, "classification",
                                           "2026-01-01T00:00:00Z"))
    store.put_bytes("health.png", PNG)
    older = root.child("runs/older")
    publish_checkpoint(RunFolder(older).claim("rf-older"), 10, {"state.pt": b"old"}, {})
    ModelRegistry(root).promote("digits", run_uri=older.uri, checkpoint="ckpt-000000010",
                                metrics={"accuracy": 0.91, "loss": 0.3})


def nonfinite(root):
    evidence = {"step": 17, "rank": 1, "loss": "nan", "partition": "part-00001",
                "replay": {"reproducible": True, "rows": [3, 9]}}
    _result(root.child(_key()), status="failed",
            verdict=Verdict("NONFINITE", "loss became nan at step 17 on rank 1", evidence))


def remediated(root):
    _result(root.child(_key()), verdict=Verdict("HEALTHY", "no problem found"),
            remedies=[{"try": 2, "verdict": "NONFINITE", "remedy": "lower_learning_rate",
                       "words": "learning rate x0.5, resumed before step 10"}],
            world_size_changes=[{"from": 2, "to": 1, "at_step": 20}])


def running(root):
    folder = RunFolder(root.child(_key()))
    attempt = folder.claim("rf-a1")
    attempt.store.put_bytes("heartbeat.json", Heartbeat(attempt="rf-a1", seq=3, time=1.0, step=12, silent_seconds=0.1,
                                                        progress_at=1.0, phase="training").to_json())


def change(why, sizes, commit_step, redone, rank0_changed, failed_at=1767225600.0):
    """A change of an elastic job's workers as rank/elastic.py's Membership.as_record writes it."""
    return {"why": why, "detail": "a collective failed" if why == "left" else "Horovod's driver added hosts",
            "left" if why == "left" else "joined": ["127.0.1:0"], "seen_at_step": (commit_step or 0) + redone,
            "from_world_size": sizes[0], "to_world_size": sizes[1], "commit_step": commit_step,
            "steps_redone": redone, "failed_at": failed_at, "resumed_at": failed_at + 0.65,
            "rank0_changed": rank0_changed, "recovery_seconds": 0.65}


def elastic_running(root):
    """An elastic job still training, its rank 0 replaced: the change is in its health records only (under the
    new rank 0's claim of the same attempt), no result yet."""
    folder = RunFolder(root.child(_key()))
    folder.claim("rf-a1")
    claim = folder.claim("rf-a1")
    log = HealthLog(claim.store, flush_seconds=0.0, attempt="rf-a1", first_seq=claim.ref.first_seq)
    log.append(record("membership", **change("left", (3, 2), 10, 2, True)))
    claim.store.put_bytes("heartbeat.json", Heartbeat(attempt="rf-a1", seq=0, time=1.0, step=14, silent_seconds=0.1,
                                                      progress_at=1.0, phase="training").to_json())


def elastic_done(root):
    """Its result lists the changes and its records are gone (or were never kept): the result's are shown."""
    _result(root.child(_key()), verdict=Verdict("HEALTHY", "no problem found"),
            membership_changes=[change("left", (3, 2), None, 12, False), change("joined", (2, 3), 400, 0, False)])


STATES = [
    # state, what the page must show, what it must not
    (healthy, ["HEALTHY", "no problem found in 40 steps", 'data-testid="health-plot"', "ckpt-000000040",
               "2.9 KiB", "0.93", "digits v1", "0.91"], ["Evidence", "Remediated"]),
    (nonfinite, ["NONFINITE", "loss became nan at step 17 on rank 1", 'data-testid="evidence"', "part-00001",
                 'data-testid="replay"', "reproducible", "not saved yet", "not evaluated yet"], ["Remediated"]),
    (remediated, ["Remediated", "learning rate x0.5", "World size changes", "at_step"], ["Evidence"]),
    (running, ["NONE", "no result yet: training is running (step 12, phase training)", "rf-a1", "none published"],
     ["Evidence", "Remediated", "Membership changes"]),
    (elastic_running, ['data-testid="membership-changes"', "2026-01-01 00:00:00 UTC", "3 → 2", "left",
                       "left: 127.0.1:0", "a collective failed", "<td>10</td><td>2</td><td>0.65</td><td>yes</td><td>rf-a1</td>",
                       "training is running (step 14"], ["Remediated"]),
    (elastic_done, ["Membership changes", "3 → 2", "2 → 3", "joined: 127.0.1:0", "the run folder's</span></td><td>12",
                    "<td>400</td><td>0</td><td>0.65</td><td>no</td><td>rf-a1</td>"], ["Evidence"]),
]


@pytest.mark.parametrize("doc, attempt, expected", [
    (change("left", (3, 2), 10, 2, True) | {"attempt": "a1"}, None,
     MembershipRow("a1", "left", "a collective failed", 3, 2, 10, 2, 1767225600.0, 0.65, True, "left: 127.0.1:0")),
    # result.json's entries name no attempt: the result's; recovery from the times when not given
    ({"why": "joined", "from_world_size": 2, "to_world_size": 3, "failed_at": 100.0, "resumed_at": 106.5}, "a2",
     MembershipRow("a2", "joined", None, 2, 3, None, None, 100.0, 6.5, None)),
    # a value of the wrong type reads as unknown, not as a wrong figure
    ({"from_world_size": "3", "steps_redone": True, "rank0_changed": 1, "failed_at": None, "left": "127.0.1:0"}, None,
     MembershipRow(None, None, None, None, None, None, None, None, None, None)),
])
def test_a_membership_change_is_read_leniently(doc, attempt, expected):
    assert MembershipRow.of(doc, attempt) == expected


def test_the_records_changes_are_preferred_to_the_results(root):
    """Both say: the records (every attempt's, the run still writing them) win over result.json's."""
    elastic_running(root)
    folder = RunFolder(root.child(_key()))
    attempt = folder.claim("rf-a2")
    attempt.publish_result(json.dumps(RunResult(status="failed", attempt="rf-a2", step=40, epoch=2, world_size=2,
                                                loss=0.25).to_dict()
                                      | {"membership_changes": [change("joined", (1, 2), 30, 0, False)]}).encode())
    overview = read_overview(folder)
    assert overview.result.membership_changes  # result.json has one too
    changes = overview.membership_changes
    assert [(m.attempt, m.why, m.to_world_size) for m in changes] == [("rf-a1", "left", 2)]


@pytest.fixture
def root(tmp_path, monkeypatch):
    monkeypatch.setenv("RINGFLOW_STORE", str(tmp_path / "store"))
    return open_store(str(tmp_path / "store"))


@pytest.mark.parametrize("make, shown, hidden", STATES, ids=[s[0].__name__ for s in STATES])
def test_the_page_shows_each_state_of_a_run(root, make, shown, hidden):
    make(root)
    folder = RunFolder(root.child(_key()), uri=f"{root.uri}/{_key()}")
    page = run_page.render(read_overview(folder, registry_root=root), title="t", plot_png=folder.read_health_plot(),
                           folder_link=None)
    for text in shown:
        assert text in page, text
    for text in hidden:
        assert text not in page, text


def test_everything_shown_is_escaped(root):
    store = root.child(_key())
    _result(store, status="failed", verdict=Verdict("NONFINITE", "<script>alert(1)</script>", {"<b>": "<i>x</i>"}),
            remedies=[{"<img src=x>": "\"><svg>"}],
            membership_changes=[{"why": "<b>", "detail": "<i>x</i>", "failed_at": 1e300}])
    page = run_page.render(read_overview(RunFolder(store)), title="<t>", plot_png=None, folder_link='"><a>')
    assert "<script>" not in page and "<b>" not in page and "<i>" not in page and "<svg>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page and "&lt;t&gt;" in page and "Membership changes" in page
    assert re.findall(r"<(\w+)", page) and set(re.findall(r"<(\w+)", page)) <= {
        "html", "head", "meta", "title", "style", "body", "h1", "h2", "p", "span", "a", "table", "tr", "th", "td", "pre"}


def test_a_broken_part_is_named_and_the_rest_still_shown(root):
    store = root.child(_key())
    _result(store, verdict=Verdict("HEALTHY", "fine"))
    store.put_bytes("eval.json", b"{not json")
    page = run_page.render(read_overview(RunFolder(store)), title="t", plot_png=None, folder_link=None)
    assert "eval.json is not JSON" in page and "HEALTHY" in page and "ckpt-000000040" in page


@pytest.fixture
def client(root, monkeypatch):
    allowed = {"dags": {DAG}}

    def authorize(dag_id, user):
        if dag_id not in allowed["dags"]:
            raise HTTPException(403, f"you may not read the task logs of DAG {dag_id!r}")

    monkeypatch.setattr(plugin, "_authorize", authorize)
    app = plugin.create_app()
    app.dependency_overrides[plugin._current_user] = lambda: "someone"
    client = TestClient(app)
    client.allowed = allowed
    return client


def _path(route: str) -> str:
    return route.partition("/ringflow")[2]  # the app is mounted at /ringflow


def test_the_page_is_reached_by_its_link_and_from_any_task_of_the_pipeline(root, client):
    nonfinite(root)
    link = run_page_link(f"{root.uri}/{_key()}", str(root.uri))
    assert link == f"{RUN_PAGE_ROUTE}/runs/{DAG}/manual__2026-01-01T00_00_00_00_00/{GROUP}"
    by_key = client.get(_path(link))
    assert by_key.status_code == 200 and "loss became nan at step 17" in by_key.text
    for task, index in ((f"{GROUP}.train", "{MAP_INDEX}"), (f"{GROUP}.evaluate", "-1"), (f"{GROUP}.train", None)):
        query = {} if index is None else {"map_index": index}
        by_task = client.get(_path(f"{TASK_RUN_PAGE_ROUTE}/{DAG}/{RUN}/{task}"), params=query)
        assert by_task.status_code == 200 and "loss became nan at step 17" in by_task.text, task


def test_the_page_keeps_the_file_routes_access_rule(root, client):
    nonfinite(root)
    client.allowed["dags"] = set()
    assert client.get(_path(f"{RUN_PAGE_ROUTE}/{_key()}")).status_code == 403
    assert client.get(_path(f"{RUN_PAGE_ROUTE}/models/digits")).status_code == 404


def test_a_run_not_started_yet_says_so(root, client):
    missing = client.get(_path(f"{TASK_RUN_PAGE_ROUTE}/{DAG}/{RUN}/{GROUP}.validate"))
    assert missing.status_code == 404
    assert "no run folder at" in missing.text and "has not started training" in missing.text


def test_an_s3_store_without_the_api_servers_connection_says_what_to_define(client, monkeypatch):
    monkeypatch.setenv("RINGFLOW_STORE", "s3://bucket/ringflow")
    monkeypatch.delenv("AIRFLOW_CONN_RINGFLOW_S3", raising=False)
    page = client.get(_path(f"{RUN_PAGE_ROUTE}/{_key()}"))
    assert page.status_code == 503
    assert "the API server cannot open it" in page.text and "AIRFLOW_CONN_RINGFLOW_S3" in page.text


@pytest.mark.job
def test_an_s3_run_is_read_through_the_api_servers_connection(s3_server, s3_connection, client, monkeypatch):
    from ringflow.operators.connections import open_store_for

    store_uri = f"s3://{s3_server.new_bucket()}/ml"
    monkeypatch.setenv("RINGFLOW_STORE", store_uri)
    healthy(open_store_for(store_uri, s3_connection))
    page = client.get(_path(f"{TASK_RUN_PAGE_ROUTE}/{DAG}/{RUN}/{GROUP}.train"))
    assert page.status_code == 200, page.text
    assert "no problem found in 40 steps" in page.text and 'data-testid="health-plot"' in page.text
    assert "digits v1" in page.text  # the registry of the same store
    assert "(files)" not in page.text  # no local listing of an s3:// run folder

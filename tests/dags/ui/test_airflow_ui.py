"""ringflow_retrain through the Airflow web UI in a real browser: Playwright driving Debian's chromium (headless)
against a real Airflow (real_airflow.py: api-server, scheduler, triggerer, dag-processor on 127.0.0.1, the simple
auth manager).

Log in on the login page, open the DAG, trigger it from the trigger form with a bad value (the form shows the
parameter's error and no run is created: checked through the REST API) and then with good ones, follow the run
to success, read the train task's log (step lines, the health verdict), open its extra links (the run page, the
health plot and the run folder, served by the ringflow plugin on the API server), and open the run page from the
task instance's "Run page" tab (the plugin's external view: verdict, evidence and plot in the UI's frame).

A screenshot of each step lands in `$RINGFLOW_UI_SCREENSHOTS` if set (CI can keep that folder), else in the
test's tmp_path, `screenshots/` (pytest keeps the last three runs under /tmp/pytest-of-<user>/); a failure adds
`failure.png` and `failure.html`. chromium comes from scripts/setup.sh; Playwright never downloads a browser.
"""
from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import urllib.parse

import pytest
from real_airflow import drop_digits

from ringflow.operators.links import local_link, run_page_link
from ringflow.training.core.runs import store_layout

pytestmark = [pytest.mark.service, pytest.mark.background, pytest.mark.timeout(900)]

# The DAG the form triggers: ringflow_retrain's pipeline on the dataset asset's file. The shared Airflow's scheduler
# creates runs (real_airflow.py), and ringflow_retrain's weekly schedule would add a run on unpausing.
DAG_ID = "ringflow_retrain_on_asset"
TRAIN = "digits.train"
SCREENSHOTS_ENV = "RINGFLOW_UI_SCREENSHOTS"
GOOD = {"model_name": "digits-ui", "num_workers": "2", "epochs": "1"}  # one epoch: 22 steps on 2 workers
UI_WAIT_MS = 60_000  # the UI polls running DAG runs every few seconds; a page never needs longer to catch up


@pytest.fixture
def screenshots(tmp_path) -> pathlib.Path:
    folder = pathlib.Path(os.environ.get(SCREENSHOTS_ENV) or tmp_path / "screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture
def page(screenshots):
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium")
    if not chromium:
        pytest.fail("Debian's chromium is not installed: run scripts/setup.sh (it runs apt-get install chromium)")
    with sync_playwright() as playwright:
        # chromium's sandbox needs user namespaces that root in a container does not get
        browser = playwright.chromium.launch(executable_path=chromium, headless=True,
                                             args=["--no-sandbox"] if os.geteuid() == 0 else [])
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.set_default_timeout(UI_WAIT_MS)
        try:
            yield page
        finally:
            browser.close()


@pytest.fixture
def airflow(real_airflow):
    return real_airflow


class Steps:
    """Numbered screenshots, one per step, and the page as it was when a step failed."""

    def __init__(self, page, folder: pathlib.Path) -> None:
        self.page, self.folder, self.count = page, folder, 0

    def shot(self, name: str) -> None:
        self.count += 1
        self.page.screenshot(path=self.folder / f"{self.count:02d}-{name}.png", full_page=True)

    def failed(self) -> None:
        try:
            self.page.screenshot(path=self.folder / "failure.png", full_page=True)
            (self.folder / "failure.html").write_text(self.page.content())
        except Exception:  # noqa: BLE001 - the browser may be what broke; keep the test's own error
            pass


def test_trigger_follow_and_inspect_a_run_in_the_browser(airflow, page, screenshots):
    """Also the REST API's side of it: no token, no answer; a bad value refused; the promote task's XCom."""
    from playwright.sync_api import expect

    expect.set_options(timeout=UI_WAIT_MS)
    store = airflow.store
    drop_digits(store)  # the file the DAG reads by default
    assert airflow.request("GET", f"/api/v2/dags/{DAG_ID}", auth=False).status_code == 401
    airflow.unpause(DAG_ID)
    refused = airflow.request("POST", f"/api/v2/dags/{DAG_ID}/dagRuns",
                              {"logical_date": None, "conf": {"num_workers": 0}})
    assert refused.status_code == 400 and "num_workers" in refused.text, refused.text
    steps = Steps(page, screenshots)
    print(f"screenshots: {screenshots}")
    try:
        _log_in(page, airflow, steps, expect)
        run_id = _trigger(page, airflow, steps, expect)
        _follow(page, airflow, run_id, steps, expect)
        _train_log(page, steps, expect)
        _extra_links(page, airflow, run_id, store, steps, expect)
        _run_page_tab(page, airflow, run_id, steps, expect)
        _promoted(airflow, run_id, store)
    except BaseException:
        steps.failed()
        raise


def _promoted(airflow, run_id, store) -> None:
    """Every task succeeded, and the promote task's XCom (through the REST API) names version 1 of the model."""
    state, summary = airflow.wait_for_run(DAG_ID, run_id, timeout=60)
    assert state == "success" and set(summary.values()) == {"success"} and len(summary) == 5, summary
    path = f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/digits.promote/xcomEntries/return_value"
    xcom = airflow.request("GET", path).json()
    assert xcom["value"]["promoted"] is True and xcom["value"]["version"] == 1, xcom
    assert json.loads((store / "models" / "digits-ui" / "production.json").read_text())["version"] == 1


def _log_in(page, airflow, steps, expect) -> None:
    page.goto(f"{airflow.base}/dags/{DAG_ID}")
    expect(page.get_by_text("Sign into Airflow")).to_be_visible()  # not logged in: the login page
    user, password = airflow.user_password()
    page.get_by_label("Username").fill(user)
    page.get_by_label("Password").fill(password)
    steps.shot("login")
    page.get_by_role("button", name="Sign in").click()
    expect(page).to_have_url(re.compile(rf"/dags/{DAG_ID}$"))  # back where it was sent from
    expect(page.get_by_role("link", name="Runs", exact=True)).to_be_visible()
    steps.shot("dag")


def _trigger(page, airflow, steps, expect) -> str:
    page.get_by_role("button", name="Trigger").first.click()
    dialog = page.get_by_role("dialog")
    expect(dialog.get_by_text(f"Trigger Dag - {DAG_ID}")).to_be_visible()
    field = lambda name: dialog.locator(f"input[name=element_{name}]")  # noqa: E731 - the form's inputs

    # A number field keeps to its Param's bounds: 0 workers cannot even be entered.
    field("num_workers").fill("0")
    field("epochs").click()
    expect(field("num_workers")).to_have_value("1")
    # A text field is checked against its Param's pattern when submitted: the form shows why, and no run starts.
    # (The DAG tests share one Airflow database, so earlier tests' runs of this DAG may be there: count them.)
    before = {r["dag_run_id"] for r in _runs(airflow)}
    field("model_name").fill("bad name!")
    dialog.get_by_role("button", name="Trigger").last.click()
    error = dialog.get_by_text("Invalid input for param model_name: 'bad name!' does not match")
    expect(error).to_be_visible()
    error.scroll_into_view_if_needed()  # the form shows it at its top
    steps.shot("bad-value-refused")
    assert {r["dag_run_id"] for r in _runs(airflow)} == before

    # The error toast sits over the form's button while the pointer rests on it.
    page.mouse.move(5, 5)
    expect(page.get_by_role("status").filter(has_text="Failed to Trigger Dag")).to_be_hidden()
    for name, value in GOOD.items():
        field(name).fill(value)
    steps.shot("good-values")
    dialog.get_by_role("button", name="Trigger").last.click()
    expect(page).to_have_url(re.compile(rf"/dags/{DAG_ID}/runs/[^/]+$"))  # the UI opens the new run
    run_id = urllib.parse.unquote(page.url.rsplit("/", 1)[1])
    steps.shot("run-started")

    runs = [r for r in _runs(airflow) if r["dag_run_id"] not in before]
    assert [r["dag_run_id"] for r in runs] == [run_id]  # the one run the form started
    conf = runs[0]["conf"]
    assert (conf["model_name"], conf["num_workers"], conf["epochs"]) == ("digits-ui", 2, 1), conf
    return run_id


def _runs(airflow) -> list[dict]:
    """Every run of the DAG in this Airflow's database."""
    body = airflow.request("GET", f"/api/v2/dags/{DAG_ID}/dagRuns?limit=1000").json()
    assert body["total_entries"] == len(body["dag_runs"]), "more runs than one page holds"
    return body["dag_runs"]


def _follow(page, airflow, run_id, steps, expect) -> None:
    def train_state():
        ti = airflow.request("GET", f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/{TRAIN}").json()
        if ti.get("state") == "upstream_failed":
            raise AssertionError(f"the run failed before training:\n{airflow.failed_task_logs(DAG_ID, run_id)}")
        return ti.get("state") if ti.get("state") in ("running", "deferred", "success", "failed") else None

    airflow.wait_for("the train task to start", train_state, timeout=300, interval=2)
    steps.shot("training")
    state, summary = airflow.wait_for_run(DAG_ID, run_id, timeout=480)
    assert state == "success", f"{summary}\n{airflow.tail()}"
    # the page, left open, catches up by itself
    header = page.get_by_test_id("header-card")
    expect(header.get_by_role("heading", name=run_id)).to_be_visible()
    expect(header.get_by_test_id("state-badge")).to_have_text("Success")
    expect(page.get_by_role("row").filter(has_text="digits.promote").get_by_text("Success")).to_be_visible()
    steps.shot("run-succeeded")


def _train_log(page, steps, expect) -> None:
    page.get_by_role("link", name=TRAIN, exact=True).click()
    expect(page.get_by_role("link", name="Logs", exact=True)).to_be_visible()
    log = page.get_by_text(re.compile(r"step=10 epoch=1/1 loss=\d"))
    expect(log.first).to_be_visible()
    verdict = re.compile(r"training succeeded: checkpoint ckpt-\d+, step \d+, health HEALTHY")
    expect(page.get_by_text(verdict)).to_be_visible()
    steps.shot("train-log")


def _extra_links(page, airflow, run_id, store, steps, expect) -> None:
    run_folder = store_layout.run_uri(str(store), DAG_ID, run_id, "digits")
    want = {"Run folder": local_link(run_folder, str(store), folder=True),
            "Health plot": local_link(f"{run_folder}/health.png", str(store)),
            "Run page": run_page_link(run_folder, str(store))}
    assert all(want.values()), want
    page.get_by_role("link", name="Details", exact=True).click()
    expect(page.get_by_text("Extra Links")).to_be_visible()
    for name, href in want.items():
        # an extra link is a button-styled link (the task's "Run page" tab has the same name)
        button = page.get_by_role("link", name=name, exact=True).and_(page.locator('[type="button"]'))
        expect(button).to_have_attribute("href", href)
    steps.shot("extra-links")

    # Same origin: each opens in this tab, with the UI's session (the plugin refuses anyone without one).
    with page.expect_response(lambda r: r.url.endswith(want["Health plot"])) as plot:
        page.get_by_role("link", name="Health plot", exact=True).click()
    assert plot.value.status == 200 and plot.value.headers["content-type"] == "image/png"
    steps.shot("health-plot")
    page.go_back()
    page.get_by_role("link", name="Run folder", exact=True).click()
    for name in ("health.png", "run.json", "eval.json", "attempts/"):
        expect(page.get_by_role("link", name=name, exact=True)).to_be_visible()
    steps.shot("run-folder")

    assert airflow.request("GET", want["Health plot"], auth=False).status_code == 401
    assert airflow.request("GET", want["Health plot"]).status_code == 200  # a bearer token works as well
    assert airflow.request("GET", "/ringflow/store/models/digits-ui/production.json").status_code == 404


def _run_page_tab(page, airflow, run_id, steps, expect) -> None:
    """The task instance's "Run page" tab shows the plugin's page in a frame: the verdict, its evidence, the plot."""
    page.goto(f"{airflow.base}/dags/{DAG_ID}/runs/{urllib.parse.quote(run_id, safe='')}/tasks/{TRAIN}")
    page.locator('a[href$="/plugin/ringflow-run-page"]').click()
    frame = page.frame_locator('iframe[src*="/ringflow/task-run-page/"]')
    expect(frame.get_by_test_id("verdict")).to_have_text("HEALTHY")
    expect(frame.get_by_test_id("reason")).to_have_text("no sign of trouble")
    expect(frame.get_by_test_id("evidence")).to_contain_text("steps_measured")
    plot = frame.get_by_test_id("health-plot")
    expect(plot).to_be_visible()
    assert plot.evaluate("img => img.complete && img.naturalWidth > 0"), "the health plot did not load"
    expect(frame.get_by_test_id("metrics")).to_contain_text("accuracy")  # the evaluate step's metrics
    steps.shot("run-page")

"""End to end in a real local Airflow (``scripts/airflow_local.py`` -> ``airflow standalone``).

One standalone Airflow serves the whole module: API server, scheduler, DAG processor and triggerer on SQLite with
the LocalExecutor, two configured GPUs (``[gpu] devices=0,1``; the host has none, so torch runs on the CPU) and a
two-slot GPU pool. The browser tests drive the real UI in Debian's Chromium through Playwright; the GPU telemetry
UI's tests keep their screenshots in ``$AIRFLOW_GPU_TEST_ARTIFACTS/ui`` (default ``test-artifacts/ui``).

The module's tests run in file order on one worker (tests/conftest.py): the pool test first, on an idle Airflow
(a pool resized to 0 fails every GPU task queued meanwhile); then :func:`runs` triggers the sweep and the retried
training, which run on while the Docker and the browser tests wait for their own runs (the Docker test's task waits
for a pool slot behind theirs).
"""

from __future__ import annotations

import os
import re
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import quote, unquote

import pytest
from local_airflow import POLL, REPO, LocalAirflow
from telemetry.ui.profiles import GPU_PROFILE as SAMPLE_GPU_PROFILE

from airflow_gpu_provider.telemetry.profile import Profile
from airflow_gpu_provider.telemetry.report import try_key
from airflow_gpu_provider.telemetry.ui.format import gib, pct

pytestmark = pytest.mark.slow

DEMO = "gpu_training_demo"
SWEEP = "gpu_hyperparameter_sweep"
RESILIENT = "resilient_training"
DEFERRABLE = "deferrable_training"
RATES = [0.01, 0.03, 0.1, 0.3]  # the sweep's trials: four, on a two-slot pool
CHROMIUM = os.environ.get("AIRFLOW_GPU_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]


@pytest.fixture(scope="module")
def airflow(tmp_path_factory: pytest.TempPathFactory):
    server = LocalAirflow(tmp_path_factory.mktemp("standalone") / "home", devices="0,1")
    started = time.monotonic()
    server.start()
    try:
        for dag_id in (DEMO, SWEEP, RESILIENT, DEFERRABLE):
            server.wait_for_dag(dag_id)
        print(f"local Airflow ready in {time.monotonic() - started:.1f}s (script: {server.ready['seconds_to_ready']}s)")
        yield server
    finally:
        server.stop()
        assert server.leftover_processes() == []


def test_launcher_creates_the_gpu_pool_and_prints_credentials(airflow):
    assert airflow.ready["url"] == airflow.url
    assert airflow.ready["password"]
    assert airflow.ready["gpus"] == 2
    assert airflow.ready["pool"] == "gpu"
    pool = airflow.api("GET", "/api/v2/pools/gpu")
    assert pool["slots"] == 2
    assert "[gpu] devices" in pool["description"]
    assert "Airflow is ready" in airflow.log_path.read_text()
    assert f"password: {airflow.ready['password']}" in airflow.log_path.read_text()


def test_example_dags_have_no_import_errors(airflow):
    errors = airflow.api("GET", "/api/v2/importErrors?limit=100")
    assert errors["total_entries"] == 0, [(e["filename"], e["stack_trace"][-3000:]) for e in errors["import_errors"]]
    dags = {dag["dag_id"]: dag for dag in airflow.api("GET", "/api/v2/dags?limit=100")["dags"]}
    assert {DEMO, SWEEP, RESILIENT, DEFERRABLE} <= set(dags)


def _failed_at_once(airflow: LocalAirflow) -> dict[str, dict]:
    """Trigger the demo; return its task instances once the run failed, which must take seconds, not forever."""
    started = time.monotonic()
    run_id = airflow.trigger(DEMO, {"epochs": 1})
    run = airflow.wait_for_run(DEMO, run_id, timeout=120)
    elapsed = time.monotonic() - started
    states = {ti["task_id"]: ti for ti in airflow.task_instances(DEMO, run_id)}
    assert run["state"] == "failed", states
    assert elapsed < 60, f"the run took {elapsed:.0f}s to fail"
    assert (states["train"]["state"], states["train"]["pool"]) == ("failed", "gpu")
    assert states["report"]["state"] == "upstream_failed"
    return states


def test_gpu_pool_too_small_or_missing_fails_the_task_at_once_with_a_note(airflow):
    """The provider's listener in the scheduler fails what could never leave it, instead of waiting forever."""
    active = airflow.api("GET", "/api/v2/dags/~/dagRuns?state=queued&state=running")["dag_runs"]
    assert active == [], f"this test resizes the pool of every run: it runs before any other: {active}"
    airflow.unpause(DEMO)

    def resize(slots: int) -> None:
        body = {"pool": "gpu", "slots": slots, "include_deferred": False}
        airflow.api("PATCH", "/api/v2/pools/gpu?update_mask=slots", body)

    resize(0)
    try:
        states = _failed_at_once(airflow)
        assert "needs 1 slot of GPU pool 'gpu', which has only 0" in states["train"]["note"]
        airflow.api("DELETE", "/api/v2/pools/gpu")
        states = _failed_at_once(airflow)
        assert "GPU pool 'gpu' does not exist" in states["train"]["note"]
    finally:
        if not any(p["name"] == "gpu" for p in airflow.api("GET", "/api/v2/pools")["pools"]):
            airflow.api("POST", "/api/v2/pools", {"name": "gpu", "slots": 2, "include_deferred": False})
        resize(2)
    assert airflow.api("GET", "/api/v2/pools/gpu")["slots"] == 2


@pytest.fixture(scope="module")
def runs(airflow) -> dict[str, str]:
    """The sweep's run and the retried training's, triggered together once the pool test is done: they run on while
    the tests before their own wait (they share the pool's two slots with those tests' runs). Their ids by DAG."""
    conf = {
        SWEEP: {"learning_rates": RATES, "epochs": 2},
        RESILIENT: {"epochs": 2, "fail_at_epoch": 1, "failure": "host_oom"},  # try 1 runs out of host memory
    }
    for dag_id in conf:
        airflow.unpause(dag_id)
    return {dag_id: airflow.trigger(dag_id, dag_conf) for dag_id, dag_conf in conf.items()}


def test_a_user_ending_a_deferred_docker_task_stops_its_container(airflow, docker_client, runs):
    """Mark failed, as a user does in the UI, while the container runs deferred: the triggerer's ``on_kill`` (Airflow
    3.3) stops and removes it at once, instead of it running on to its end.
    """
    dag_id = DEFERRABLE
    airflow.unpause(dag_id)
    conf = {"deferrable": True, "epochs": 1, "seconds_per_epoch": 600, "backend": "docker", "gpu_count": 0}
    run_id = airflow.trigger(dag_id, conf)
    label = f"airflow-gpu-provider.run_id={run_id}"

    def deferred_with_its_container() -> list[dict]:
        states = {ti["task_id"]: ti["state"] for ti in airflow.task_instances(dag_id, run_id)}
        running = docker_client.containers(filters={"label": label})
        return running if states.get("long_job_deferred") == "deferred" and running else []

    deadline = time.monotonic() + 300  # its task (no downstream: the lowest priority weight) waits for a pool slot
    while not (containers := deferred_with_its_container()):
        assert time.monotonic() < deadline, (airflow.task_instances(dag_id, run_id), airflow.log_tail())
        time.sleep(POLL)
    [container] = containers
    folder = airflow.home / "logs" / f"dag_id={dag_id}" / f"run_id={run_id}" / "task_id=long_job_deferred"

    def trigger_log_says(line: str) -> bool:  # the triggerer writes the trigger's log as it goes
        return any(line in log.read_text() for log in folder.glob("*trigger*"))

    # Only a trigger the triggerer runs can be told: one ended before it started is left to the reaper (docs)
    deadline = time.monotonic() + 60
    while not trigger_log_says(f"Watching container {container['Id'][:12]}"):
        assert time.monotonic() < deadline, f"the trigger never started: {airflow.log_tail()}"
        time.sleep(POLL)
    path = f"/api/v2/dags/{dag_id}/dagRuns/{quote(run_id, safe='')}/taskInstances/long_job_deferred"
    airflow.api("PATCH", path, {"new_state": "failed"})

    deadline = time.monotonic() + 60
    while docker_client.containers(all=True, filters={"label": label}):
        assert time.monotonic() < deadline, f"container {container['Id'][:12]} outlived its task:\n{airflow.log_tail()}"
        time.sleep(POLL)
    states = {ti["task_id"]: ti["state"] for ti in airflow.task_instances(dag_id, run_id)}
    assert states["long_job_deferred"] == "failed"
    deadline = time.monotonic() + 60
    while not trigger_log_says("ended by a user: stopping container"):
        logs = {log.name: log.read_text()[-2000:] for log in folder.glob("*")}
        assert time.monotonic() < deadline, f"no on_kill line in the trigger's log: {logs}"
        time.sleep(POLL)


@pytest.fixture(scope="module")
def browser():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("python playwright is missing: install the dev extra")
    if not Path(CHROMIUM).exists():
        if os.environ.get("AIRFLOW_GPU_REQUIRE_BROWSER") == "1" or os.environ.get("CI") == "true":
            pytest.fail(f"no Chromium at {CHROMIUM} (apt-get install chromium)")
        pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium)")
    with sync_playwright() as playwright:
        instance = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        try:
            yield instance
        finally:
            instance.close()


# --------------------------------------------------------------------------- the GPU telemetry UI (ui/)
ARTIFACTS = Path(os.environ.get("AIRFLOW_GPU_TEST_ARTIFACTS") or REPO / "test-artifacts") / "ui"


def _get(url: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    """GET a page of the GPU app: its status and text (no exception on 4xx)."""
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def _push_sample_profile(airflow: LocalAirflow, run_id: str, task_id: str, *, replace: bool = False) -> dict:
    """TEST DATA: store the two-GPU sample of tests/telemetry/ui/profiles.py as ``task_id``'s profile (through the REST API).

    These machines have no GPU, so a real run only ever stores a CPU profile; this puts a multi-GPU one in front of
    the real UI too (``replace``: over the profile the task stored, in XCom and in the task state store's row of its
    try, which the GPU tab reads first).
    """
    quoted = quote(run_id, safe="")
    entries = f"/api/v2/dags/{DEMO}/dagRuns/{quoted}/taskInstances/{task_id}/xcomEntries"
    if replace:
        airflow.api("PATCH", f"{entries}/gpu_profile", {"value": SAMPLE_GPU_PROFILE, "map_index": -1})
        key = try_key(SAMPLE_GPU_PROFILE["task"]["try_number"])
        state_store = f"/api/v2/dags/{DEMO}/dagRuns/{quoted}/taskInstances/{task_id}/state-store/{key}"
        airflow.api("PATCH", state_store, {"value": SAMPLE_GPU_PROFILE})
    else:
        airflow.api("POST", entries, {"key": "gpu_profile", "value": SAMPLE_GPU_PROFILE, "map_index": -1})
    return airflow.xcom(DEMO, run_id, task_id, key="gpu_profile")


def test_gpu_pages_need_a_signed_in_user(airflow):
    plugin = next(p for p in airflow.api("GET", "/api/v2/plugins")["plugins"] if p["name"] == "airflow_gpu_provider")
    assert [app["url_prefix"] for app in plugin["fastapi_apps"]] == ["/gpu"]
    assert {(view["name"], view["destination"]) for view in plugin["external_views"]} == {
        ("GPU", "task_instance"),
        ("GPUs", "nav"),
    }
    task_page = f"{airflow.url}/gpu/dags/{DEMO}/runs/no-such-run/tasks/train"
    for url in (f"{airflow.url}/gpu/", task_page):
        assert _get(url)[0] == 401, url
        assert _get(url, {"Authorization": "Bearer forged"})[0] == 403, url
        assert _get(url, {"Cookie": "_token=forged"})[0] == 403, url
    signed_in = {"Authorization": f"Bearer {airflow.token()}"}
    status, body = _get(f"{airflow.url}/gpu/", signed_in)
    assert status == 200 and "<h1>GPUs</h1>" in body
    status, body = _get(task_page, signed_in)
    assert status == 404 and "No such task instance" in body


def _log_in(page, airflow: LocalAirflow) -> None:
    page.goto(airflow.url)
    page.get_by_label("Username").fill(airflow.ready["username"])
    page.get_by_label("Password").fill(airflow.ready["password"])
    page.get_by_role("button", name="Sign in").click()
    page.get_by_role("button", name="Sign in").wait_for(state="detached")


def _check_gpu_tab(page, airflow: LocalAirflow, run_id: str, task_id: str, value: dict, shot: str) -> None:
    """Open the task instance's GPU tab; check the charts (a line per device) and the numbers; take a screenshot."""
    profile = Profile.read(value)
    assert profile is not None and profile.devices, value
    page.goto(f"{airflow.url}/dags/{DEMO}/runs/{quote(run_id, safe='')}/tasks/{task_id}")
    page.get_by_role("link", name="GPU", exact=True).click()
    page.wait_for_url(f"**/tasks/{task_id}/plugin/gpu")
    tab = page.frame_locator('iframe[title="GPU"]')
    charts = tab.locator("figure.chart svg")
    charts.nth(1).wait_for()
    assert charts.count() == 2  # utilisation, memory
    indexes = [device.index for device in profile.devices]
    for chart in charts.all():
        lines = chart.locator("path.series")
        assert [line.get_attribute("data-device") for line in lines.all()] == indexes
        assert all(len(line.get_attribute("d") or "") > 20 for line in lines.all())
    text = tab.locator("body").inner_text()
    assert f"{DEMO} / {task_id}" in text and f"run {run_id}" in text
    for device in profile.devices:
        assert device.name in text
        assert pct(device.mean_util) in text and pct(device.p95_util) in text
        assert gib(device.peak_memory) in text
    assert all(advice in text for advice in profile.advice)
    assert ("CPU profile (no GPU on this host)" in text) == profile.is_cpu
    page.screenshot(path=str(ARTIFACTS / shot), full_page=True)


def test_browser_trigger_with_changed_param_then_summary_xcom_gpu_tab_and_gpus_page(airflow, browser, runs):
    """The demo triggered in the UI with changed params, its task log and XCom, then its GPU tab and the GPUs page.

    One run of the demo for what were two tests, each with a run of its own: the trigger form's, and the GPU pages'.
    """
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page = browser.new_page(viewport={"width": 1400, "height": 1500})
    page.set_default_timeout(30_000)
    step = "start"
    try:
        step = "1. log in"
        _log_in(page, airflow)

        step = "2. open and unpause the DAG"
        airflow.api("PATCH", f"/api/v2/dags/{DEMO}", {"is_paused": True})
        page.goto(f"{airflow.url}/dags/{DEMO}")
        page.get_by_text(DEMO).first.wait_for()
        toggle = page.get_by_role("checkbox").first
        assert not toggle.is_checked()
        toggle.click(force=True)
        deadline = time.monotonic() + 30
        while airflow.api("GET", f"/api/v2/dags/{DEMO}")["is_paused"]:
            assert time.monotonic() < deadline, "the pause switch did not unpause the DAG"
            time.sleep(POLL)

        step = "3. trigger with a changed param"
        page.get_by_role("button", name="Trigger Dag").click()
        dialog = page.get_by_role("dialog")
        epochs = dialog.locator("input[name=element_epochs]")
        assert epochs.input_value() == "20"
        epochs.fill("3")
        dialog.locator("input[name=element_batch_size]").fill("128")
        dialog.get_by_role("button", name="Trigger", exact=True).click()
        dialog.wait_for(state="hidden")
        page.wait_for_url(f"**/dags/{DEMO}/runs/**")
        run_id = unquote(page.url.split("/runs/")[1].split("/")[0])

        step = "4. wait for success"
        run = airflow.wait_for_run(DEMO, run_id)
        assert run["state"] == "success", airflow.task_instances(DEMO, run_id)
        assert run["conf"]["epochs"] == 3
        assert run["triggered_by"] == "ui"

        step = "5. the task log shows the resource summary"
        task_url = f"{airflow.url}/dags/{DEMO}/runs/{quote(run_id, safe='')}/tasks/train"
        page.goto(task_url)
        page.get_by_text("[gpu] GPUs assigned").first.wait_for()
        summary = [line for line in page.inner_text("body").splitlines() if "[gpu]" in line]
        assert any("backend=local" in line for line in summary), summary
        assert any("resources: 1x nvidia GPU" in line for line in summary), summary

        step = "6. the XCom result is there"
        page.goto(f"{task_url}/xcom")
        page.get_by_text("final_loss").first.wait_for()
        assert "return_value" in page.inner_text("body")
        metrics = airflow.xcom(DEMO, run_id, "train")
        assert metrics["epochs"] == 3
        assert metrics["batch_size"] == 128
        assert metrics["final_loss"] < metrics["initial_loss"]

        step = "7. the GPU tab of the train task: its real (CPU) profile"
        real = airflow.xcom(DEMO, run_id, "train", key="gpu_profile")  # stored by the operator
        assert real["kind"] == "cpu" and real["task"]["task_id"] == "train", real
        forged = _push_sample_profile(airflow, run_id, "report")  # a plain task's: the pages never show it (rule T2)
        _check_gpu_tab(page, airflow, run_id, "train", real, "gpu-tab.png")

        step = "8. the GPU tab with the two-GPU sample profile"
        for dag_id, other in runs.items():  # the GPUs page lists the newest profiles first: this one, from here on
            assert airflow.wait_for_run(dag_id, other, timeout=540)["state"] == "success", (dag_id, other)
        sample = _push_sample_profile(airflow, run_id, "train", replace=True)
        _check_gpu_tab(page, airflow, run_id, "train", sample, "gpu-tab-two-gpus.png")

        step = "9. the GPUs page lists the GPU task's try, its host and its models; not the plain task's"
        page.goto(airflow.url)
        page.get_by_role("link", name="GPUs", exact=True).click()
        page.wait_for_url("**/plugin/gpus**")
        overview = page.frame_locator('iframe[title="GPUs"]')
        tries_table = overview.locator("h2:has-text('Recent GPU tasks') + table")
        row_link = tries_table.locator(f'a[href*="/runs/{quote(run_id, safe="")}/tasks/train?"]')
        row_link.wait_for()
        text = overview.locator("body").inner_text()
        assert f"{DEMO} / train" in text and f"{DEMO} / report" not in text  # the forged one is not listed
        assert sample["host"] in text and forged == sample
        assert all(device["name"] in text for device in sample["devices"])
        # the hosts summary first, then each task's advice once, then the tries (which link to it)
        assert overview.locator("h2").all_inner_texts() == ["Hosts and models", "Advice", "Recent GPU tasks"]
        assert overview.locator("#advice-1").inner_text() == f"{DEMO} / train"
        page.screenshot(path=str(ARTIFACTS / "gpus-page.png"), full_page=True)

        step = "9b. the filters (a GET form, no script) narrow the page to one host and model"
        overview.locator('select[name="host"]').select_option(sample["host"])
        overview.locator('select[name="model"]').select_option(sample["devices"][0]["name"])
        overview.get_by_role("button", name="Show").click()
        overview.get_by_text(f"with host {sample['host']}, model {sample['devices'][0]['name']}").wait_for()
        assert overview.locator(f'a[href*="/runs/{quote(run_id, safe="")}/tasks/train?"]').count() == 2  # advice, row

        step = "10. a row opens the try's page inside the same view"
        row_link.click()
        overview.locator("figure.chart svg").nth(1).wait_for()
        assert f"run {run_id}" in overview.locator("body").inner_text()
        assert "/plugin/gpus/gpu/dags/" in page.url
    except Exception as error:
        page.screenshot(path=str(ARTIFACTS / "failure.png"), full_page=True)
        (ARTIFACTS / "failure.html").write_text(page.content())
        raise AssertionError(f"browser step {step!r} failed: {error}; screenshot and HTML in {ARTIFACTS}") from error
    finally:
        page.close()


def test_rest_api_sweep_shares_two_gpus_without_oversubscription(airflow, runs):
    rates, run_id = RATES, runs[SWEEP]  # triggered through the REST API
    run = airflow.wait_for_run(SWEEP, run_id)
    assert run["state"] == "success", airflow.task_instances(SWEEP, run_id)
    assert run["conf"]["learning_rates"] == rates

    trials = [ti for ti in airflow.task_instances(SWEEP, run_id) if ti["task_id"] == "trial"]
    assert sorted(ti["map_index"] for ti in trials) == [0, 1, 2, 3]
    assert {(ti["pool"], ti["pool_slots"], ti["state"]) for ti in trials} == {("gpu", 1, "success")}

    results = [airflow.xcom(SWEEP, run_id, "trial", index) for index in range(4)]
    assert sorted(result["learning_rate"] for result in results) == rates
    assert {result["visible_devices"] for result in results} <= {"0", "1"}
    for result in results:  # when any trial starts: at most one other runs, on the other GPU
        overlapping = [o for o in results if o is not result and o["started"] <= result["started"] < o["finished"]]
        assert len(overlapping) <= 1, results
        assert all(other["visible_devices"] != result["visible_devices"] for other in overlapping), results
    best = airflow.xcom(SWEEP, run_id, "pick_best")
    assert best["accuracy"] == max(result["accuracy"] for result in results)


@pytest.mark.timeout(900)
def test_browser_gpu_tab_shows_every_try_and_the_escalation_timeline(airflow, browser, runs):
    """The example ``resilient_training``, try 1 made to run out of host memory (:func:`runs`): Airflow retries on
    the next memory step, and the GPU tab keeps try 1's profile (its XCom is gone) beside try 2's, with the timeline
    in words."""
    run_id = runs[RESILIENT]
    run = airflow.wait_for_run(RESILIENT, run_id, timeout=540)
    train = next(ti for ti in airflow.task_instances(RESILIENT, run_id) if ti["task_id"] == "train")
    assert run["state"] == "success" and train["try_number"] == 2, airflow.task_instances(RESILIENT, run_id)
    latest = airflow.xcom(RESILIENT, run_id, "train", key="gpu_profile")
    assert latest["task"]["try_number"] == 2  # XCom holds the latest try's only

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page = browser.new_page(viewport={"width": 1400, "height": 1800})
    page.set_default_timeout(30_000)
    step = "start"
    try:
        step = "1. log in"
        _log_in(page, airflow)

        step = "2. the GPU tab shows the latest try, lists both, and the timeline"
        page.goto(f"{airflow.url}/dags/{RESILIENT}/runs/{quote(run_id, safe='')}/tasks/train")
        page.get_by_role("link", name="GPU", exact=True).click()
        page.wait_for_url("**/tasks/train/plugin/gpu")
        tab = page.frame_locator('iframe[title="GPU"]')
        tab.locator("figure.chart svg").nth(1).wait_for()
        text = tab.locator("body").inner_text()
        assert "try 2 of 2" in text and "try 2 (shown)" in text, text
        tries = [row.inner_text() for row in tab.locator("h2:has-text('Tries') + table tbody tr").all()]
        assert [row.split("\t")[:2] for row in tries] == [["try 2 (shown)", "success"], ["try 1", "failed"]], tries
        timeline = [row.inner_text() for row in tab.locator("h2:has-text('escalation') + p + table tbody tr").all()]
        assert len(timeline) == 2, timeline
        one, two = (row.split("\t") for row in timeline)
        assert one[0] == "1" and one[2] == "ran out of host memory (limit 8.0 GiB)", one
        assert one[4] == "memory 8.0 GiB → 16.0 GiB" and two[0] == "2" and two[2] == "succeeded", timeline
        assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d[+-]\d\d:\d\d", one[1]), one  # ISO, with its offset
        page.screenshot(path=str(ARTIFACTS / "gpu-tab-tries.png"), full_page=True)

        step = "3. try 1's profile, one click away"
        tab.get_by_role("link", name="try 1", exact=True).click()
        tab.get_by_text("try 1 of 2").first.wait_for()
        tab.locator("figure.chart svg").nth(1).wait_for()
        text = tab.locator("body").inner_text()
        assert "try 1 (shown)" in text and "8.0 GiB memory" in text, text
        assert "Host CPUs" in text and "/proc/pressure/cpu" in text
        page.screenshot(path=str(ARTIFACTS / "gpu-tab-try-1.png"), full_page=True)
    except Exception as error:
        page.screenshot(path=str(ARTIFACTS / "failure.png"), full_page=True)
        (ARTIFACTS / "failure.html").write_text(page.content())
        raise AssertionError(f"browser step {step!r} failed: {error}; screenshot and HTML in {ARTIFACTS}") from error
    finally:
        page.close()

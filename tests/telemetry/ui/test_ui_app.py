"""The FastAPI app mounted as the API server mounts it, with Airflow's security dependencies (no Airflow server).

The real authentication (a token, the UI's cookie) and the real XCom rows are checked end to end in
``tests/test_local_airflow.py``; here the auth manager and the store are stand-ins.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from jwt import InvalidTokenError
from telemetry.ui.profiles import CPU_PROFILE, ESCALATION, FALLBACK_PROFILE, GPU_PROFILE

from airflow_gpu_provider.telemetry import ui
from airflow_gpu_provider.telemetry.profile import Profile
from airflow_gpu_provider.telemetry.ui import app as ui_app
from airflow_gpu_provider.telemetry.ui import store
from airflow_gpu_provider.telemetry.ui.format import ProfileRow, TaskKey, TaskTry

TASK = "/gpu/dags/gpu_training_demo/runs/manual__2026-11-23T13%3A00%3A00%2B00%3A00/tasks/train"


class FakeAuthManager:
    """Knows one user, ``viewer``, who may read the DAGs in ``readable``."""

    def __init__(self, readable: set[str]) -> None:
        self.readable = readable
        self.asked: list[dict[str, Any]] = []

    async def get_user_from_token(self, token: str) -> Any:
        if token != "good":
            raise InvalidTokenError("bad token")
        return SimpleNamespace(name="viewer")

    def is_authorized_dag(self, *, method: str, user: Any, access_entity: Any = None, details: Any = None) -> bool:
        self.asked.append({"method": method, "entity": access_entity, "dag": details.id if details else None})
        return details is None or details.id is None or details.id in self.readable

    def get_authorized_dag_ids(self, *, user: Any, method: str = "GET", session: Any = None) -> set[str]:
        return set(self.readable)


@pytest.fixture
def auth(monkeypatch: pytest.MonkeyPatch) -> FakeAuthManager:
    manager = FakeAuthManager({"gpu_training_demo"})
    monkeypatch.setattr("airflow.api_fastapi.core_api.security.get_auth_manager", lambda: manager)
    monkeypatch.setattr(ui_app, "get_auth_manager", lambda: manager)
    monkeypatch.setattr("airflow.models.dag.DagModel.get_team_name", staticmethod(lambda dag_id, **_: None))
    return manager


@pytest.fixture
def client(auth: FakeAuthManager, monkeypatch: pytest.MonkeyPatch) -> TestClient:
    """The app under /gpu of a parent app, as ``init_plugins`` mounts it; the store answers from the samples."""
    profiles = {
        TaskKey("gpu_training_demo", "manual__2026-11-23T13:00:00+00:00", "train"): GPU_PROFILE,
        TaskKey("gpu_training_demo", "r-cpu", "train", 2): CPU_PROFILE,
        TaskKey("secret_dag", "r", "train"): GPU_PROFILE,
    }
    retried = TaskKey("gpu_training_demo", "r-retried", "train")
    tries = {  # try 1 fell back to the CPU, try 2 ran on the GPUs; the latest try's profile is shown first
        retried: [
            TaskTry(1, "failed", None, None, "worker-2", Profile.read({**FALLBACK_PROFILE, "task": {"try_number": 1}})),
            TaskTry(2, "success", None, None, "worker-1", Profile.read({**GPU_PROFILE, "task": {"try_number": 2}})),
            TaskTry(3, "running", None, None, "worker-1", None),
        ]
    }

    def recent(session: Any, dag_ids: set[str], limit: int = 200) -> list[ProfileRow]:
        rows = [ProfileRow(key, 0.0, Profile.read(value)) for key, value in profiles.items() if key.dag_id in dag_ids]
        return rows[:limit]  # type: ignore[misc]

    def task_tries(session: Any, key: TaskKey) -> list[TaskTry]:
        profile = Profile.read(profiles.get(key))
        return tries.get(key) or (
            [TaskTry(profile.try_number or 1, "success", None, None, "", profile)] if profile else []
        )

    monkeypatch.setattr(store, "task_tries", task_tries)
    monkeypatch.setattr(
        store,
        "escalation_history",
        lambda session, key: ("a ladder", ESCALATION["tries"]) if key == retried else ("", []),
    )
    monkeypatch.setattr(
        store, "task_state", lambda session, key: "running" if key.run_id in ("r-run", "r-retried") else None
    )
    monkeypatch.setattr(store, "recent_profiles", recent)
    monkeypatch.setattr(store, "profiled_dags", lambda session, dag_ids: sorted({k.dag_id for k in profiles} & dag_ids))
    app = ui_app.create_app()
    app.dependency_overrides[store_session()] = lambda: None
    parent = FastAPI()
    parent.mount(ui.URL_PREFIX, app)
    return TestClient(parent)


def store_session() -> Any:
    from airflow.api_fastapi.common.db.common import _get_session

    return _get_session


GOOD = {"Authorization": "Bearer good"}


@pytest.mark.parametrize("path", ["/gpu/", TASK])
def test_anonymous_gets_401_and_a_bad_token_403(client, path):
    anonymous = client.get(path)
    assert anonymous.status_code == 401
    assert "Sign in to Airflow" in anonymous.text
    assert client.get(path, headers={"Authorization": "Bearer forged"}).status_code == 403
    assert client.get(path, cookies={"_token": "forged"}).status_code == 403


def test_the_ui_cookie_is_accepted(client):
    response = client.get(TASK, cookies={"_token": "good"})
    assert response.status_code == 200, response.text


def test_task_page_checks_xcom_access_to_its_dag(client, auth):
    response = client.get(TASK, headers=GOOD)
    assert response.status_code == 200
    assert "NVIDIA A100-SXM4-80GB" in response.text
    assert response.headers["content-security-policy"].startswith("default-src 'none'")
    assert response.headers["x-content-type-options"] == "nosniff"
    assert auth.asked[-1] == {"method": "GET", "entity": ui_app.DagAccessEntity.XCOM, "dag": "gpu_training_demo"}
    denied = client.get("/gpu/dags/secret_dag/runs/r/tasks/train", headers=GOOD)
    assert denied.status_code == 403
    assert "NVIDIA" not in denied.text


def test_map_index_placeholder_of_an_unmapped_task_reads_as_minus_one(client):
    assert "GPU profile" in client.get(TASK + "?map_index={MAP_INDEX}", headers=GOOD).text
    assert "GPU profile" in client.get(TASK + "?map_index=%7BMAP_INDEX%7D", headers=GOOD).text
    cpu = client.get("/gpu/dags/gpu_training_demo/runs/r-cpu/tasks/train?map_index=2", headers=GOOD)
    assert "CPU profile (no GPU on this host)" in cpu.text


def test_task_without_profile(client):
    running = client.get("/gpu/dags/gpu_training_demo/runs/r-run/tasks/train", headers=GOOD)
    assert running.status_code == 200
    assert "The task is running" in running.text
    missing = client.get("/gpu/dags/gpu_training_demo/runs/nope/tasks/train", headers=GOOD)
    assert missing.status_code == 404
    assert "No such task instance" in missing.text


def test_gpus_page_lists_only_readable_dags_with_links_under_the_mount(client, auth):
    response = client.get("/gpu/", headers=GOOD)
    assert response.status_code == 200
    assert "gpu_training_demo / train" in response.text
    assert "secret_dag" not in response.text
    assert 'href="/gpu/dags/gpu_training_demo/runs/r-cpu/tasks/train?map_index=2"' in response.text
    assert auth.asked[-1] == {"method": "GET", "entity": ui_app.DagAccessEntity.XCOM, "dag": None}
    assert client.get("/gpu/?limit=0", headers=GOOD).status_code == 422


def test_gpus_page_filters_by_dag_host_and_model_from_its_own_form(client):
    """The form (a GET to the page itself: no script) offers what was read; a DAG the user may not read is refused
    by Airflow's own check, which reads the query's ``dag_id``."""
    page = client.get("/gpu/", headers=GOOD).text
    assert '<form class="filters" method="get" action="/gpu/">' in page
    assert '<select name="dag_id"><option value="">all</option><option value="gpu_training_demo">' in page
    assert "secret_dag" not in page  # not even as a choice
    assert '<option value="worker-1">worker-1</option><option value="ci-runner-7">' not in page  # sorted
    assert '<option value="ci-runner-7">ci-runner-7</option><option value="worker-1">worker-1</option>' in page
    by_host = client.get("/gpu/?host=ci-runner-7", headers=GOOD).text
    assert "r-cpu" in by_host and "manual__2026-11-23T13:00:00+00:00" not in by_host
    assert '<option value="ci-runner-7" selected>' in by_host and "1 of the 2 newest" in by_host
    by_model = client.get("/gpu/?model=NVIDIA+A100-SXM4-80GB&dag_id=gpu_training_demo", headers=GOOD).text
    assert "manual__2026-11-23T13:00:00+00:00" in by_model and "r-cpu" not in by_model
    assert "with DAG gpu_training_demo, model NVIDIA A100-SXM4-80GB" in by_model
    assert client.get("/gpu/?dag_id=secret_dag", headers=GOOD).status_code == 403
    assert "No try matches these filters." in client.get("/gpu/?host=elsewhere", headers=GOOD).text
    assert client.get("/gpu/?host=" + "x" * 251, headers=GOOD).status_code == 422


def test_plugin_entries_point_the_tab_and_the_nav_at_the_app():
    tab, nav = ui.EXTERNAL_VIEWS
    assert tab["destination"] == "task_instance" and tab["url_route"] == "gpu"
    assert tab["href"] == "/gpu/dags/{DAG_ID}/runs/{RUN_ID}/tasks/{TASK_ID}?map_index={MAP_INDEX}"
    assert nav == {"name": "GPUs", "href": "/gpu/", "destination": "nav", "url_route": "gpus", "nav_top_level": True}
    (entry,) = ui.FASTAPI_APPS
    assert entry["url_prefix"] == "/gpu"
    assert isinstance(entry["app"], ui.LazyApp)


def test_the_lazy_app_builds_the_real_one_on_its_first_request(auth, monkeypatch):
    built = []
    real = ui_app.create_app

    def counting() -> FastAPI:
        built.append(1)
        return real()

    monkeypatch.setattr(ui_app, "create_app", counting)
    parent = FastAPI()
    parent.mount("/gpu", ui.LazyApp())
    client = TestClient(parent)
    assert built == []
    assert client.get("/gpu/").status_code == 401
    assert client.get("/gpu/nope").status_code == 404
    assert built == [1]


def test_the_tab_shows_the_latest_profiled_try_and_any_other_on_request(client):
    page = "/gpu/dags/gpu_training_demo/runs/r-retried/tasks/train"
    latest = client.get(page, headers=GOOD)
    assert latest.status_code == 200
    assert "try 2 of 3" in latest.text and "<strong>try 2</strong> (shown)" in latest.text
    assert f'href="{page}?map_index=-1&amp;try_number=1">try 1</a>' in latest.text
    assert "running: no profile yet" in latest.text  # try 3
    assert "ran out of GPU memory on NVIDIA L4 (24.0 GiB)" in latest.text  # the timeline
    first = client.get(page + "?try_number=1", headers=GOOD)
    assert first.status_code == 200
    assert "<strong>try 1</strong> (shown)" in first.text and "CPU fallback" in first.text
    missing = client.get(page + "?try_number=3", headers=GOOD)
    assert (
        missing.status_code == 404 and "No GPU profile" in missing.text and "accelerator L4 → A100-80GB" in missing.text
    )
    assert client.get(page + "?try_number=0", headers=GOOD).status_code == 422

"""The FastAPI app behind the GPU tab and the GPUs page, mounted by the API server under ``/gpu``.

Authentication and authorisation are Airflow's own: :func:`requires_access_dag` (``GET`` on the DAG's XComs, with
the user from the bearer token or the UI's JWT cookie) guards both pages, and the GPUs page lists only the DAGs the
auth manager lets the user read. An anonymous request gets 401 (403 for an invalid token or a denied DAG).
"""

from __future__ import annotations

import re
from typing import Annotated

from airflow.api_fastapi.app import get_auth_manager
from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
from airflow.api_fastapi.common.db.common import SessionDep
from airflow.api_fastapi.core_api.security import GetUserDep, requires_access_dag
from fastapi import Depends, FastAPI, Query, Request
from fastapi.responses import HTMLResponse
from starlette.exceptions import HTTPException

from airflow_gpu_provider.telemetry.ui import store
from airflow_gpu_provider.telemetry.ui.format import TaskKey
from airflow_gpu_provider.telemetry.ui.html import SECURITY_HEADERS, e, layout
from airflow_gpu_provider.telemetry.ui.overview_page import Filters, render_overview
from airflow_gpu_provider.telemetry.ui.task_page import render_no_profile, render_task_page
from airflow_gpu_provider.telemetry.ui.timeline import render_timeline

MAX_LIMIT = 500
Chosen = Annotated[str | None, Query(max_length=250)]  # a filter of the GPUs page (empty: all)
_INTEGER = re.compile(r"-?\d{1,9}")

ReadXCom = Depends(requires_access_dag("GET", DagAccessEntity.XCOM))


def html(content: str, status_code: int = 200, headers: dict[str, str] | None = None) -> HTMLResponse:
    """An HTML response with the pages' security headers (no script, no external resource)."""
    return HTMLResponse(content, status_code=status_code, headers={**SECURITY_HEADERS, **(headers or {})})


def map_index_of(value: str) -> int:
    """The map index from the query: the UI leaves ``{MAP_INDEX}`` in the href of an unmapped task (-1)."""
    return int(value) if _INTEGER.fullmatch(value) else -1


def _base(request: Request) -> str:
    """Where this app is mounted (``/gpu``, after ``[api] base_url``'s path)."""
    return str(request.scope.get("root_path", "")).rstrip("/")


def create_app() -> FastAPI:
    """The app: ``/`` (the GPUs page) and ``/dags/{dag_id}/runs/{run_id}/tasks/{task_id}`` (one try's profile)."""
    app = FastAPI(title="GPU telemetry", docs_url=None, redoc_url=None, openapi_url=None)

    @app.exception_handler(HTTPException)
    async def error_page(request: Request, error: HTTPException) -> HTMLResponse:
        hint = " Sign in to Airflow, then open this page again." if error.status_code == 401 else ""
        body = f"<h1>{error.status_code}</h1><p>{e(error.detail)}.{e(hint)}</p>"
        return html(layout(f"{error.status_code}", body), error.status_code, dict(error.headers or {}))

    @app.get("/", response_class=HTMLResponse, dependencies=[ReadXCom])
    def gpus_page(
        request: Request,
        user: GetUserDep,
        session: SessionDep,
        *,
        limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = store.RECENT_LIMIT,
        dag_id: Chosen = None,
        host: Chosen = None,
        model: Chosen = None,
    ) -> HTMLResponse:
        """Recent GPU task tries across the DAGs the user may read, filtered by DAG, host and model."""
        dag_ids = get_auth_manager().get_authorized_dag_ids(user=user, method="GET")
        filters = Filters(dag_id or None, host or None, model or None)
        shown = dag_ids & {filters.dag_id} if filters.dag_id else dag_ids  # only a DAG the user may read
        rows = store.recent_profiles(session, shown, limit)
        dags = store.profiled_dags(session, dag_ids)
        return html(render_overview(rows, base=_base(request), limit=limit, filters=filters, dags=dags))

    @app.get("/dags/{dag_id}/runs/{run_id}/tasks/{task_id}", response_class=HTMLResponse, dependencies=[ReadXCom])
    def task_page(
        request: Request,
        dag_id: str,
        run_id: str,
        task_id: str,
        *,
        session: SessionDep,
        map_index: str = "-1",
        try_number: Annotated[int | None, Query(ge=1, le=10**6)] = None,
    ) -> HTMLResponse:
        """One try's profile (the latest with one, unless ``try_number`` says), the tries, the timeline.

        Without a profile to show: why there may be none.
        """
        from airflow.settings import TIMEZONE  # [core] default_timezone, as the Airflow UI's server side has it

        key = TaskKey(dag_id, run_id, task_id, map_index_of(map_index))
        home = _base(request) + "/"
        tries = store.task_tries(session, key)
        ladder, history = store.escalation_history(session, key)
        timeline = render_timeline(ladder, history, zone=TIMEZONE)
        shown = [t.profile for t in tries if t.profile is not None and try_number in (None, t.number)]
        if not shown:
            state = store.task_state(session, key)
            page = render_no_profile(key, state=state, home=home, tries=tries, timeline=timeline)
            return html(page, 404 if state is None or try_number is not None else 200)
        return html(render_task_page(shown[-1], key, home=home, tries=tries, timeline=timeline))

    return app

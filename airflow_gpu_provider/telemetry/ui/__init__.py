"""The GPU telemetry UI: a FastAPI app under ``/gpu``, a GPU tab on the task instance page and a GPUs page.

``plugin.py`` registers :data:`FASTAPI_APPS` and :data:`EXTERNAL_VIEWS`. Every Airflow component imports the plugin,
so this module stays cheap: the app (FastAPI, Airflow's security module, the models) is built on its first request
in the API server (:class:`LazyApp`).

The Airflow UI shows an external view that has a ``url_route`` in a same-origin iframe: the GPU tab at
``/dags/D/runs/R/tasks/T[/mapped/M]/plugin/gpu`` and the nav entry at ``/plugin/gpus``. The iframe sends the UI's
JWT cookie, which the app checks with Airflow's own security dependencies.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from airflow.configuration import conf

URL_PREFIX = "/gpu"
# The app is mounted under [api] base_url's path too (Airflow's root_path); the UI puts hrefs into iframes as is.
BASE_PATH = urlsplit(conf.get("api", "base_url", fallback="") or "").path.rstrip("/") + URL_PREFIX
TASK_TAB_ROUTE = "gpu"
NAV_ROUTE = "gpus"


class LazyApp:
    """An ASGI app that builds ``airflow_gpu_provider.telemetry.ui.app:create_app()`` when it is first called."""

    def __init__(self) -> None:
        self._app: Any = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        """Hand the request to the real app, building it first if needed."""
        if self._app is None:
            from airflow_gpu_provider.telemetry.ui.app import create_app

            self._app = create_app()
        await self._app(scope, receive, send)


FASTAPI_APPS = [{"app": LazyApp(), "url_prefix": URL_PREFIX, "name": "GPU telemetry"}]
EXTERNAL_VIEWS = [
    {
        "name": "GPU",
        # The UI fills {MAP_INDEX} on mapped task instances only; the app reads anything else as -1.
        "href": BASE_PATH + "/dags/{DAG_ID}/runs/{RUN_ID}/tasks/{TASK_ID}?map_index={MAP_INDEX}",
        "destination": "task_instance",
        "url_route": TASK_TAB_ROUTE,
    },
    {
        "name": "GPUs",
        "href": BASE_PATH + "/",
        "destination": "nav",
        "url_route": NAV_ROUTE,
        "nav_top_level": True,
    },
]

"""A successful try's profile is stored after its task instance is ``success``: off the GPU's hand-over (a listener).

Storing a profile is two execution-API calls (the ``gpu_profile`` XCom and the try's task state store key, tens of
milliseconds under load). Before the task instance is ``success``, they delay its pool slot, and so the next GPU
task. Airflow's task runner reports the success first and calls ``on_task_instance_success`` after, in the same
process: :func:`later` keeps the stores until then. A failed try's profile is stored at once (a retry may start
before a listener would run), and so is every profile where this listener is not registered (the provider's plugin
not loaded). A task process killed between the two loses its profile, never its result.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any

from airflow.listeners import hookimpl

log = logging.getLogger(__name__)
_PENDING: list[Callable[[], None]] = []


def later(store: Callable[[], None]) -> None:
    """Run ``store`` once the task instance is ``success`` (at once where this listener is not registered)."""
    from airflow.listeners.listener import get_listener_manager

    if not get_listener_manager().pm.is_registered(sys.modules[__name__]):
        store()
        return
    _PENDING.append(store)


@hookimpl
def on_task_instance_success(previous_state: Any, task_instance: Any) -> None:
    """The task instance is ``success``: store what waited for it. Never raises."""
    while _PENDING:
        try:
            _PENDING.pop(0)()
        except Exception as err:  # noqa: BLE001 - the task has succeeded: its profile is all that is lost
            log.warning("[gpu] The task's profile could not be stored: %s: %s", type(err).__name__, err)


@hookimpl
def on_task_instance_failed(previous_state: Any, task_instance: Any, error: Any) -> None:
    """A success that failed after the profile was kept (a failing callback): store it all the same."""
    on_task_instance_success(previous_state, task_instance)

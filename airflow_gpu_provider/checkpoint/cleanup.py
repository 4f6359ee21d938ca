"""Delete a DAG run's checkpoint folders when the run succeeds (``[gpu] checkpoint_cleanup``).

The listener runs where the run's state changes (the scheduler; the process of ``dag.test()``). It finds each
task's root in the task instance's rendered ``checkpoint`` field (``None``: the default root) and removes
``<root>/<dag_id>/<run_id>``: a local root only when this host reaches it and the folder is this user's own (a
worker-local state dir on another host stays: it is removed with the state dir), a URI root through Airflow's
``ObjectStoragePath`` (fsspec; an ``s3://conn_id@bucket/...`` root uses that connection). Never raises.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path
from typing import Any

from airflow.listeners import hookimpl

from airflow_gpu_provider import config
from airflow_gpu_provider.checkpoint.location import check_root, default_root, is_uri, join, run_folder
from airflow_gpu_provider.host.state import UntrustedStateError, check_owned

log = logging.getLogger(__name__)


def run_roots(dag_run: Any, session: Any) -> set[str]:
    """The checkpoint roots the run's GPU tasks used (their rendered ``checkpoint``; ``None`` is the default)."""
    from airflow.models.renderedtifields import RenderedTaskInstanceFields

    from airflow_gpu_provider.config.worker import GpuConfig

    default = default_root(GpuConfig.read())
    roots: set[str] = set()
    for ti in dag_run.get_task_instances(session=session):
        fields = RenderedTaskInstanceFields.get_templated_fields(ti, session=session) or {}
        if "checkpoint" not in fields:
            continue  # not a GPU task, or one that never rendered
        try:
            root = check_root("checkpoint cleanup", "checkpoint", fields["checkpoint"])
        except ValueError as err:  # a root that was never used either
            log.warning("Checkpoint cleanup of %s skips %s: %s", dag_run.run_id, ti.task_id, err)
            continue
        if root is not False:
            roots.add(default if root is None else str(root))
    return roots


def remove_run_folder(root: str, dag_id: str, run_id: str) -> bool:
    """Delete ``<root>/<dag_id>/<run_id>``; whether there was one to delete."""
    folder = join(root, run_folder(dag_id, run_id))
    if is_uri(root):
        from airflow.sdk import ObjectStoragePath

        path = ObjectStoragePath(folder)
        if not path.exists():
            return False
        path.rmdir(recursive=True)
        return True
    try:
        check_owned(Path(folder), os.lstat(folder), directory=True)
    except FileNotFoundError:
        return False
    shutil.rmtree(folder)
    return True


def cleanup(dag_run: Any, session: Any) -> list[str]:
    """Remove the run's checkpoint folders; return those removed."""
    removed = []
    for root in sorted(run_roots(dag_run, session)):
        try:
            if remove_run_folder(root, dag_run.dag_id, dag_run.run_id):
                removed.append(join(root, run_folder(dag_run.dag_id, dag_run.run_id)))
        except (OSError, UntrustedStateError, ImportError, ValueError) as err:
            log.warning("Could not delete the checkpoints of %s under %s: %s", dag_run.run_id, root, err)
    if removed:
        log.info("Deleted the checkpoints of successful run %s: %s", dag_run.run_id, ", ".join(removed))
    return removed


@hookimpl
def on_dag_run_success(dag_run: Any, msg: str) -> None:
    """A successful run needs its checkpoints no more."""
    if not config.get("checkpoint_cleanup"):
        return
    from sqlalchemy.orm import object_session

    # the scheduler's own session, read only: a session of ours would commit inside the scheduler's loop, which
    # it refuses ("UNEXPECTED COMMIT"), and the scheduler would stop
    session = object_session(dag_run)
    try:
        if session is not None:
            cleanup(dag_run, session)
            return
        from airflow.utils.session import create_session

        with create_session() as own:
            cleanup(dag_run, own)
    except Exception:  # a listener never breaks the scheduler
        log.exception("Checkpoint cleanup of %s failed; the folders stay", dag_run.run_id)

"""Delete a DAG run's checkpoint folders when the run succeeds (``[gpu] checkpoint_cleanup``).

The listener runs where the run's state changes (the scheduler; the process of ``dag.test()``). It finds each
task's root in the task instance's rendered ``checkpoint`` field (``None``: the default root), keeps only the roots
the deployment's ``[gpu]`` section allows (read here, in the scheduler), and removes ``<root>/<dag_id>/<run_id>``:
a local root's folder only when it is the provider's (marked for this run, reached without following links; a
worker-local state dir on another host stays, and goes with the state dir), a URI root's through Airflow's
``ObjectStoragePath`` (fsspec; an ``s3://conn_id@bucket/...`` root, as the admin listed it, uses that connection),
when the worker marked it for this run (a ``file://`` root is the local path it names).
Rules A1 and F2 of docs/security.md: a DAG's code and a run id never choose what the scheduler deletes. Never raises.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from airflow.listeners import hookimpl

from airflow_gpu_provider import config
from airflow_gpu_provider.checkpoint.location import check_root, default_root, join, run_folder
from airflow_gpu_provider.exceptions import GpuTaskError
from airflow_gpu_provider.policy.checkpoints import allowed, remove_run
from airflow_gpu_provider.runtime.protocol import redact

if TYPE_CHECKING:
    from airflow_gpu_provider.policy import Policy

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


def remove_run_folder(root: str, dag_id: str, run_id: str, policy: Policy) -> bool:
    """Delete ``<root>/<dag_id>/<run_id>`` when the deployment allows ``root``; whether there was one to delete.

    Rule A1 (docs/security.md): DAG-author code never acts in the scheduler, and a rendered ``checkpoint`` is the DAG
    author's: only a root of the admin's ``[gpu]`` allow-list counts (by its components), and a folder goes only when
    it holds the provider's marker for this run: a local one through descriptors, an object store's through
    ``ObjectStoragePath`` (``policy/checkpoints.py``).
    """
    if not allowed(root, policy):
        log.warning("Checkpoint cleanup of %s skips %s: not a root the deployment allows", run_id, redact(root))
        return False
    return remove_run(root, run_folder(dag_id, run_id), {"dag_id": dag_id, "run_id": run_id}, policy)


def cleanup(dag_run: Any, session: Any) -> list[str]:
    """Remove the run's checkpoint folders; return those removed."""
    from airflow_gpu_provider.policy import Policy

    removed, policy = [], Policy.current()  # the scheduler's own [gpu] section
    for root in sorted(run_roots(dag_run, session)):
        try:
            if remove_run_folder(root, dag_run.dag_id, dag_run.run_id, policy):
                removed.append(redact(join(root, run_folder(dag_run.dag_id, dag_run.run_id))))
        except (OSError, ImportError, ValueError, GpuTaskError) as err:
            log.warning("Could not delete the checkpoints of %s under %s: %s", dag_run.run_id, redact(root), err)
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

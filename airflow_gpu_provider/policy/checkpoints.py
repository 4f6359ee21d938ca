"""Where a task may keep checkpoints, and which of them the provider may delete.

Rules F3 and F2 of docs/security.md: a task's checkpoint root is ``[gpu] checkpoint_root`` (or the state dir's
``checkpoints``), or a root of ``[gpu_policy] allowed_checkpoint_roots`` (or beneath one): a DAG author never chooses a
folder or bucket of their own. Roots are compared component by component (``paths.root_parts``: a URI with ``..``,
an empty or percent-encoded segment never passes), and a ``file://`` root is the local path it names. A task's folder
is made without following links, by the worker, private to it, with the provider's marker in its run folder; an
object store's run folder gets the same marker when a try starts. The scheduler deletes a successful run's folder
only beneath an allowed root, only when it holds that marker for that very run (``policy/paths.py``), never by the
name a DAG wrote.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping

from airflow_gpu_provider.policy import Policy, PolicyError
from airflow_gpu_provider.policy.paths import (
    MARKER,
    UnsafePathError,
    local_path,
    make_private,
    remove_marked,
    root_parts,
    write_marker,
)
from airflow_gpu_provider.runtime.protocol import redact

log = logging.getLogger(__name__)


def allowed(root: str, policy: Policy) -> bool:
    """Whether ``root`` (a path or a URI) is an allowed checkpoint root or lies beneath one, by its components."""
    try:
        parts = root_parts(root)
    except UnsafePathError:
        return False
    return any(parts[: len(limit)] == limit for limit in map(root_parts, policy.checkpoint_roots))


def check_root(owner: str, field: str, root: str, policy: Policy) -> str:
    """``root`` when the deployment allows it; else a :class:`PolicyError` naming ``allowed_checkpoint_roots``."""
    if not allowed(root, policy):
        raise PolicyError(
            owner,
            field,
            root,
            "a checkpoint root the deployment does not allow",
            option="allowed_checkpoint_roots",
            allow=", ".join(policy.checkpoint_roots),
        )
    return root


def run_identity(labels: Mapping[str, str]) -> dict[str, str]:
    """What the marker of a run folder records: the DAG and the run it is for."""
    return {"dag_id": str(labels["dag_id"]), "run_id": str(labels["run_id"])}


def make_folder(root: str, run_relative: str, task_relative: str, labels: Mapping[str, str]) -> str:
    """Make a task's checkpoint folder on this worker, and mark its run folder as the provider's.

    A path (or ``file://``) root: the folders are made private to the worker, without following links. An object
    store's root: only the marker is written, through Airflow's ``ObjectStoragePath``; where the worker cannot
    write it (no fsspec backend, no access), the run's checkpoints are never deleted, and the log says so.

    :param run_relative: ``<dag>/<run>`` under ``root`` (``checkpoint/location.py``'s path-safe names)
    :param task_relative: the task's folder under the run folder
    :return: the task's folder (a path, or the URI)
    :raises UnsafePathError: when a folder on the way is someone else's, writable by others, or a link
    """
    path = local_path(root)
    if path is None:
        _mark_store(f"{root.rstrip('/')}/{run_relative}", run_identity(labels))
        return f"{root.rstrip('/')}/{run_relative}/{task_relative}"
    run = f"{path.rstrip('/')}/{run_relative}"
    make_private(run)
    write_marker(run, run_identity(labels))
    return make_private(f"{run}/{task_relative}")


def _mark_store(folder: str, identity: Mapping[str, str]) -> None:
    from airflow.sdk import ObjectStoragePath

    try:
        (ObjectStoragePath(folder) / MARKER).write_text(json.dumps(dict(identity)))
    except Exception as err:  # noqa: BLE001 - ImportError (no fsspec backend), the store's own errors
        log.warning("Could not mark %s as the provider's (%s): its checkpoints stay after the run", redact(folder),
                    redact(str(err)))  # fmt: skip


def remove_run(root: str, run_relative: str, labels: Mapping[str, str], policy: Policy) -> bool:
    """Delete a successful run's folder: beneath an allowed root, marked by the provider for that run only.

    :return: whether there was one to delete
    :raises UnsafePathError: a folder that holds no marker of the provider for this run (or a path someone else could
        redirect)
    """
    if not allowed(root, policy):
        return False
    path, identity = local_path(root), run_identity(labels)
    if path is not None:
        return remove_marked(path, run_relative, identity)
    from airflow.sdk import ObjectStoragePath

    folder = ObjectStoragePath(f"{root.rstrip('/')}/{run_relative}")
    if not folder.exists():
        return False
    try:
        marker = json.loads((folder / MARKER).read_text()[:4096])
    except (OSError, ValueError):
        marker = None
    if not isinstance(marker, dict) or any(marker.get(key) != value for key, value in identity.items()):
        raise UnsafePathError(redact(str(folder)), "it holds no marker of the provider for this run")
    folder.rmdir(recursive=True)
    return True

"""Where a task may keep checkpoints, and which of them the provider may delete.

Rules F3 and F2 of docs/security.md: a task's checkpoint root is ``[gpu] checkpoint_root`` (or the state dir's
``checkpoints``), or a root of ``[gpu] allowed_checkpoint_roots`` (or beneath one): a DAG author never chooses a
folder or bucket of their own. A task's folder is made without following links, by the worker, private to it, with
the provider's marker in its run folder; the scheduler deletes a successful run's folder only beneath an allowed
root, only when it holds that marker for that very run (``policy/paths.py``), never by the name a DAG wrote.
"""

from __future__ import annotations

from collections.abc import Mapping

from airflow_gpu_provider.policy import Policy, PolicyError
from airflow_gpu_provider.policy.paths import beneath, make_private, remove_marked, write_marker


def allowed(root: str, policy: Policy) -> bool:
    """Whether ``root`` (a path or a URI) is an allowed checkpoint root or lies beneath one."""
    for allowed_root in policy.checkpoint_roots:
        if "://" in root or "://" in allowed_root:
            prefix = allowed_root.rstrip("/")
            if root.rstrip("/") == prefix or root.startswith(prefix + "/"):
                return True
        elif beneath(root, allowed_root):
            return True
    return False


def check_root(owner: str, field: str, root: str, policy: Policy) -> str:
    """``root`` when the deployment allows it; else a :class:`PolicyError` naming ``[gpu] allowed_checkpoint_roots``."""
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
    """Make a task's checkpoint folder (a path root) on this worker, and mark its run folder as the provider's.

    :param run_relative: ``<dag>/<run>`` under ``root`` (``checkpoint/location.py``'s path-safe names)
    :param task_relative: the task's folder under the run folder
    :return: the task's folder
    :raises UnsafePathError: when a folder on the way is someone else's, writable by others, or a link
    """
    run = f"{root.rstrip('/')}/{run_relative}"
    make_private(run)
    write_marker(run, run_identity(labels))
    return make_private(f"{run}/{task_relative}")


def remove_run(root: str, run_relative: str, labels: Mapping[str, str], policy: Policy) -> bool:
    """Delete a successful run's folder under a local ``root``: an allowed root's, marked by the provider only."""
    if not allowed(root, policy):
        return False
    return remove_marked(root, run_relative, run_identity(labels))

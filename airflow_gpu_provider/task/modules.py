"""Project code next to the DAG file: on the task's path, as the worker has it, or shipped with the function.

A task's function imports what lies next to its DAG (``import plmod`` inside the function):

- **On the worker** (the local and executor backends): the DAG file's folder and the DAG bundle's root (the folder
  Airflow puts on the worker's ``sys.path``) come first on the task's ``PYTHONPATH`` (:func:`project_folders`,
  :func:`python_path`), so the task imports what the worker would.
- **Shipped** (every backend; the one way on Docker and Kubernetes, whose tasks never see the worker's folders):
  ``modules=["plmod", "mypkg"]`` names modules and packages of those folders. They are checked when the DAG is
  parsed (names, presence, no link, size: :mod:`airflow_gpu_provider.policy.modules`, rule F4) and read on the worker
  when the task starts into one deterministic zip archive in the envelope, hashed (its ``sha256`` is in the log and
  decides nothing else: no image is built for it). The runtime unpacks it and puts it first on the path
  (``runtime/modules.py``).
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import sys
import zipfile
from collections.abc import Iterable
from typing import Any, NamedTuple

from airflow_gpu_provider.exceptions import InvalidSettingError

FIELD = "modules"
ACCEPTED = "names of modules (plmod.py) or packages (mypkg/) in the DAG file's folder or the DAG bundle's root"


def project_folders(dag_file: str | None, bundle: str | None = None) -> tuple[str, ...]:
    """Where a task's project code lies: the DAG file's folder, then the DAG bundle's root.

    :param bundle: the bundle's root when known (the task instance's bundle); else the folders of ``sys.path`` that
        hold the DAG file (Airflow's DAG processor and workers put the bundle's root there)
    """
    if not dag_file or not os.path.isabs(dag_file):
        return ()
    folder = os.path.dirname(dag_file)
    roots = [bundle] if bundle else [entry for entry in sys.path if os.path.isabs(entry)]
    holders = [root.rstrip("/") or "/" for root in roots if dag_file.startswith(root.rstrip("/") + "/")]
    return tuple(dict.fromkeys([folder, *sorted(holders, key=len, reverse=True)]))


def python_path(folders: Iterable[str], existing: str | None) -> dict[str, str]:
    """``PYTHONPATH`` with ``folders`` first, then what it already held; nothing without folders."""
    parts = [*folders, *(existing.split(os.pathsep) if existing else [])]
    return {"PYTHONPATH": os.pathsep.join(dict.fromkeys(part for part in parts if part))} if folders else {}


class ProjectModules(NamedTuple):
    """The modules a task ships, and the folders they are looked up in (the first that has one wins)."""

    names: tuple[str, ...]
    folders: tuple[str, ...]

    @classmethod
    def settle(cls, owner: str, names: object, dag_file: str | None) -> ProjectModules | None:
        """At DAG parse: the names checked, each found, no link, within the bound; ``None`` for none.

        :raises InvalidSettingError: naming ``modules``, the value and what is accepted
        """
        if names is None or names == []:
            return None
        if isinstance(names, str) or not isinstance(names, (list, tuple)):
            raise InvalidSettingError(owner, FIELD, names, "expected a list of module names", ACCEPTED)
        for name in names:
            if not isinstance(name, str) or not name.isidentifier():
                raise InvalidSettingError(
                    owner, FIELD, name, "not the name of a top-level module or package (no dots, no paths)", ACCEPTED
                )
        folders = project_folders(dag_file)
        if not folders:
            raise InvalidSettingError(owner, FIELD, list(names), "the DAG file is not known", ACCEPTED)
        modules = cls(tuple(dict.fromkeys(names)), folders)
        modules.files(owner, read=False)
        return modules

    def files(self, owner: str, *, read: bool = True) -> dict[str, bytes]:
        """The modules' files by path in the archive; ``read=False``: checked, not read.

        :raises InvalidSettingError: for a module that is missing, holds a link, or takes too much
        """
        from airflow_gpu_provider.policy.modules import Budget, TooLargeError, module_files
        from airflow_gpu_provider.policy.paths import UnsafePathError

        budget, files = Budget(), {}
        for name in self.names:
            try:
                found = next(
                    (f for f in (module_files(d, name, budget, read=read) for d in self.folders) if f is not None),
                    None,
                )
            except UnsafePathError as err:
                reason = f"{err.path}: {err.problem} (rule F4)"
                raise InvalidSettingError(owner, FIELD, name, reason, ACCEPTED) from None
            except TooLargeError as err:
                raise InvalidSettingError(
                    owner, FIELD, list(self.names), f"{err}; bake larger code into the image", ACCEPTED
                ) from None
            except OSError as err:
                raise InvalidSettingError(owner, FIELD, name, f"cannot be read ({err})", ACCEPTED) from None
            if found is None:
                raise InvalidSettingError(
                    owner, FIELD, name, f"no {name}.py nor {name}/ in {' or '.join(self.folders)}", ACCEPTED
                )
            files.update(found)
        return files

    def shipped(self, owner: str) -> dict[str, Any]:
        """At task start: the envelope's ``modules`` section, ``{"names", "sha256", "zip"}`` (base64)."""
        archive = io.BytesIO()
        with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zipped:
            for path, data in sorted(self.files(owner).items()):
                info = zipfile.ZipInfo(path, date_time=(1980, 1, 1, 0, 0, 0))  # the same bytes for the same files
                info.external_attr, info.compress_type = 0o644 << 16, zipfile.ZIP_DEFLATED
                zipped.writestr(info, data)
        data = archive.getvalue()
        return {
            "names": list(self.names),
            "sha256": hashlib.sha256(data).hexdigest(),
            "zip": base64.b64encode(data).decode(),
        }

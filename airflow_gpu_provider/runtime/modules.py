"""Project modules shipped with the task (the envelope's ``modules``): unpacked once, first on the path.

The task process unpacks the archive into a private folder (checking its ``sha256``), puts that folder first on
``sys.path`` and on ``PYTHONPATH`` (for what it starts: a launcher's ranks, a framework's own processes), and names
it in :data:`~.protocol.MODULES_DIR_ENV`, so a rank or copy of the task process that runs this runtime again uses
the same folder. The process that unpacked it removes it when it ends (:func:`remove_modules`, also at exit).
"""

from __future__ import annotations

import os
import sys
from typing import Any

from .output import say
from .protocol import MODULES_DIR_ENV, PREFIX

_MADE: list[str] = []  # the folders this process unpacked


def _on_path(folder: str) -> None:
    sys.path.insert(0, folder)
    existing = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = folder + (os.pathsep + existing if existing else "")


def unpack_modules(envelope: dict[str, Any]) -> str | None:
    """Put the envelope's project modules on the path; the folder this process made, else ``None``.

    :raises ValueError: for an archive whose hash or names are not what the envelope says (``zipfile.BadZipFile``
        is one)
    """
    section = envelope.get("modules")
    if not section:
        return None
    given = os.environ.get(MODULES_DIR_ENV)
    if given and os.path.isdir(given):  # a rank, or a copy of the task process: the task process unpacked them
        if given not in sys.path:
            sys.path.insert(0, given)
        return None
    import atexit  # here, not at the top: every task process starts the runtime, few ship modules
    import base64
    import hashlib
    import io
    import shutil
    import tempfile
    import zipfile

    data = section["zip"]
    if data.startswith("env:"):  # a pod: the archive in its own environment variable
        data = os.environ[data[4:]]
    raw = base64.b64decode(data)
    if hashlib.sha256(raw).hexdigest() != section["sha256"]:
        raise ValueError("the project modules' archive does not match its sha256")
    # 0700; in the task's working folder where it may write (the local backend's task folder, removed with the task
    # even after a SIGKILL), else in the temporary folder (a container's, a pod's)
    here = os.getcwd()
    folder = tempfile.mkdtemp(prefix="airflow-gpu-modules-", dir=here if os.access(here, os.W_OK) else None)
    with zipfile.ZipFile(io.BytesIO(raw)) as archive:
        for name in archive.namelist():
            parts = name.split("/")
            if name.startswith("/") or any(part in ("", ".", "..") for part in parts):
                shutil.rmtree(folder, ignore_errors=True)
                raise ValueError(f"the project modules' archive holds {name!r}, not a path beneath its folder")
        archive.extractall(folder)
    if not _MADE:
        atexit.register(remove_modules)
    _MADE.append(folder)
    _on_path(folder)
    os.environ[MODULES_DIR_ENV] = folder
    return folder


def describe_modules(envelope: dict[str, Any]) -> None:
    """The log line of the envelope's project modules, after the summary."""
    section = envelope.get("modules")
    if section:
        where = os.environ.get(MODULES_DIR_ENV, "?")
        names, digest = ", ".join(section["names"]), section["sha256"][:12]
        say(f"{PREFIX} project modules {names} (sha256 {digest}) first on the path: {where}")


def remove_modules() -> None:
    """Remove the folders this process unpacked."""
    if not _MADE:
        return
    import shutil

    while _MADE:
        shutil.rmtree(_MADE.pop(), ignore_errors=True)

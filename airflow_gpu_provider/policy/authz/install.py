"""The daemon as one deterministic zip archive of the standard library and the few modules it needs.

``airflow-gpu-docker-authz install --prefix DIR`` writes ``DIR/airflow-gpu-docker-authz.pyz``, root's and 0644,
into a folder only root may write (the daemon refuses to run as root from anything else): run it as
``python3 -I -S DIR/airflow-gpu-docker-authz.pyz serve ...``. ``-I`` ignores ``PYTHON*`` variables and the user's
site folder, ``-S`` every site folder: no ``airflow_local_settings.py``, no ``.pth`` file, no installed package can
run in it, and Airflow cannot be imported at all. The same source gives the same bytes (``task/runtime_zip.py``'s
way: sorted members, one date, one mode, stored), so an install can be checked against a build.
"""

from __future__ import annotations

import io
import os
import zipfile
from pathlib import Path

from airflow_gpu_provider.policy.authz.settings import root_only
from airflow_gpu_provider.task.runtime_zip import DATE_TIME, MODE

PACKAGE = Path(__file__).resolve().parents[2]  # the airflow_gpu_provider folder
FILE_NAME = "airflow-gpu-docker-authz.pyz"
#: Every module the daemon imports (``tests/policy/test_authz_plugin.py`` runs the archive with ``-I -S``).
MODULES = (
    "__init__.py", "version.py", "exceptions.py", "config/__init__.py", "config/options.py", "config/policy.py",
    "task/__init__.py", "task/labels.py", "task/runtime_zip.py", "runtime/__init__.py", "runtime/protocol.py",
    "policy/__init__.py", "policy/engine.py",
    "policy/docker.py", "policy/paths.py", "policy/rootless.py", "policy/users.py",
    *(f"policy/authz/{name}.py" for name in (
        "__init__", "__main__", "calls", "judge", "stored", "helper", "server", "settings", "install")),
)  # fmt: skip
ROOT_MAIN = b"""import sys

from airflow_gpu_provider.policy.authz.__main__ import main

if __name__ == "__main__":
    sys.exit(main())
"""


def build() -> bytes:
    """The archive: the same bytes for the same source."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
        for name, data in [("__main__.py", ROOT_MAIN)] + [
            (f"airflow_gpu_provider/{module}", (PACKAGE / module).read_bytes()) for module in sorted(MODULES)
        ]:
            info = zipfile.ZipInfo(name, date_time=DATE_TIME)
            info.create_system, info.external_attr, info.compress_type = 3, MODE << 16, zipfile.ZIP_STORED
            archive.writestr(info, data)
    return buffer.getvalue()


def install(prefix: str) -> Path:
    """Write the archive into ``prefix`` (made 0755 if missing), root's and 0644; its path.

    :raises PolicyFileError: as root, when ``prefix`` or a folder above it is not root's alone
    """
    os.makedirs(prefix, mode=0o755, exist_ok=True)
    if os.geteuid() == 0:
        root_only(os.path.realpath(prefix))
    target = Path(prefix, FILE_NAME)
    temporary = target.with_name(f".{FILE_NAME}.{os.getpid()}")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(build())
    os.chmod(temporary, 0o644)
    os.replace(temporary, target)
    return target

"""The runtime as every backend ships it: one deterministic zip archive (``runtime.pyz``) built from ``runtime/``.

Python runs a zip archive with a ``__main__.py`` at its root (PEP 441), so a runtime of many small modules still
travels as one file: a local path, a file in a Docker container's ``/airflow-gpu``, a pod's environment variable.
Inside the archive::

    __main__.py               calls airflow_gpu_runtime.__main__.main(); sys.argv[0] stays the archive's path
    airflow_gpu_runtime/      the package runtime/, under a name of its own: a provider of another version
                              installed in the image cannot shadow it (hence relative imports only in runtime/)

The same source gives the same bytes on every machine: files in path order, stored (not compressed: Kubernetes
compresses the whole archive once), dated 1980-01-01, mode 0644, no ``__pycache__``. So the archive's digest,
and every cache key built on it (a derived image's tag), changes only when the runtime's source does.

The local backend's copy of the archive (``host/state.py``, one per worker host) and the one a Docker container gets
are :func:`compiled`: the same members, then each module compiled by the worker's Python beside its source, where
zipimport looks for it, so a task process does not compile the runtime again (about 30 ms of CPU each). They are
checked against their source's hash when imported; another Python (another magic number: an image's own) compiles
the sources as it would without them.
"""

from __future__ import annotations

import functools
import hashlib
import io
import stat
import zipfile
from pathlib import Path

from airflow_gpu_provider.runtime.protocol import REAP

RUNTIME_DIR = Path(__file__).resolve().parent.parent / "runtime"
PACKAGE = "airflow_gpu_runtime"
FILE_NAME = "runtime.pyz"
DATE_TIME = (1980, 1, 1, 0, 0, 0)  # the earliest a zip archive can say
MODE = stat.S_IFREG | 0o644
ROOT_MAIN = f'''"""The GPU task runtime shipped in this archive: see {PACKAGE}/protocol.py."""

import sys

if __name__ == "__main__" and sys.argv[1:2] == ["{REAP}"] and len(sys.argv) == 4:
    # a job's entrypoint, the pinned subreaper: it imports nothing else of the runtime, which its child imports
    import os

    from {PACKAGE}.reaper import reap_main

    sys.exit(reap_main(os.path.abspath(sys.argv[0]), sys.argv[2:]))  # the archive's path, as the runtime's own

from {PACKAGE}.__main__ import main

# Run as a script, as the runtime always was: a library that starts this process again (PyTorch Lightning's ddp)
# then runs `sys.executable sys.argv`, this archive, rather than `python -m __main__`, which would not find it.
__spec__ = None

if __name__ == "__main__":
    sys.exit(main())
'''


def members(folder: Path = RUNTIME_DIR) -> list[tuple[str, bytes]]:
    """``(name in the archive, content)`` of every file, in the archive's order: the root ``__main__.py`` first."""
    sources = sorted(
        path.relative_to(folder).as_posix()
        for path in folder.rglob("*.py")
        if "__pycache__" not in path.parts and not path.name.startswith(".")
    )
    return [
        ("__main__.py", ROOT_MAIN.encode()),
        *((f"{PACKAGE}/{name}", (folder / name).read_bytes()) for name in sources),
    ]


def _add(archive: zipfile.ZipFile, name: str, data: bytes) -> None:
    info = zipfile.ZipInfo(name, date_time=DATE_TIME)
    info.create_system = 3  # Unix, on any build machine: the mode below is a Unix one
    info.external_attr = MODE << 16
    info.compress_type = zipfile.ZIP_STORED
    archive.writestr(info, data)


def build(folder: Path = RUNTIME_DIR) -> bytes:
    """The archive of the runtime in ``folder``: the same bytes for the same source, wherever it is built."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
        for name, data in members(folder):
            _add(archive, name, data)
    return buffer.getvalue()


def entries() -> bytes:
    """The archive's members, without its central directory: how :func:`compiled` archives begin."""
    data = archive()
    return data[: int.from_bytes(data[-6:-2], "little")]  # no comment: the end record is the last 22 bytes


@functools.cache
def compiled(path: str) -> bytes:
    """The archive with each module compiled by this Python (a ``.pyc`` beside each ``.py``), to be written at ``path``.

    Built once per process and path (the local backend's copy, a Docker container's ``/airflow-gpu``). The sources
    come first, byte for byte the archive's (:func:`entries`), then the compiled modules, each checked
    against its source's hash when imported (PEP 552), with the file names zipimport gives the sources.
    """
    import importlib.util
    import marshal

    buffer = io.BytesIO(archive())
    with zipfile.ZipFile(buffer, "a", zipfile.ZIP_STORED) as appended:  # after the members, before the directory
        for name, source in members():
            code = compile(source, f"{path}/{name}", "exec", dont_inherit=True)
            header = importlib.util.MAGIC_NUMBER + (0b11).to_bytes(4, "little") + importlib.util.source_hash(source)
            _add(appended, f"{name}c", header + marshal.dumps(code))
    return buffer.getvalue()


@functools.cache
def archive() -> bytes:
    """The archive of the installed runtime, built once per process."""
    return build()


@functools.cache
def digest() -> str:
    """The archive's sha256, in hex."""
    return hashlib.sha256(archive()).hexdigest()

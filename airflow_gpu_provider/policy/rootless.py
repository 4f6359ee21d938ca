"""What only a rootless engine changes in rules D2, D4 and D5 (docs/security.md, "Which deployment promises what").

- **D5, every engine**: whoever mounts an engine's socket, or the folders of the user it runs as, controls every
  task of that engine (and a rootless engine's data root lies in its user's home). :func:`engine_folders` are never
  mounted, whatever the allow-lists say: each local engine's socket folder; for a socket of a user other than root,
  that user's home and runtime dir (``/run/user/UID``); for the worker's own engine, its ``$HOME`` and
  ``$XDG_RUNTIME_DIR`` too. The provider's own fresh folders (a try's files, a checkpoint folder) are exempt, as
  everywhere (``policy/engine.py``).
- **D2, rootless**: the container's root is the engine's user on the host, so ``0:0`` is the worker's own user
  there (``backends/docker/rootless.py`` runs the worker's tasks so).
- **D4, rootless Podman**: GPUs are named by CDI (``nvidia.com/gpu=<id>`` in ``HostConfig.Devices``): accepted on a
  rootless engine only, in the exact form the provider writes; a rootful engine may read such a name as a path.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
from collections.abc import Iterable, Mapping
from typing import Any

#: the engine of a process without ``$DOCKER_HOST`` (as ``backends/docker/options.py`` names it)
DEFAULT_SOCKET = "/var/run/docker.sock"
CDI_NAME = re.compile(r"^nvidia\.com/gpu=(all|[0-9]+(:[0-9]+)?|(GPU|MIG)-[0-9A-Za-z/-]{1,80})$")


def socket_path(url: str) -> str | None:
    """The socket file of a ``unix://`` engine URL, else ``None``."""
    scheme, colon, rest = url.strip().partition("://")
    return "/" + rest.lstrip("/") if colon and scheme.lower() == "unix" and rest.strip("/") else None


def engine_folders(engines: Iterable[str]) -> tuple[str, ...]:
    """The folders whose holder controls one of these engines (the local ones; see the module's docstring)."""
    folders: list[str] = []
    for url in {*engines, os.environ.get("DOCKER_HOST") or f"unix://{DEFAULT_SOCKET}"}:
        path = socket_path(url)
        if path is None:
            continue
        folders.append(os.path.dirname(path))
        try:
            uid = os.stat(path).st_uid
        except OSError:
            continue  # not on this host (yet): its folder is all that is known
        if uid == 0:
            continue
        with contextlib.suppress(KeyError):
            folders.append(pwd.getpwuid(uid).pw_dir)
        folders.append(f"/run/user/{uid}")
        if uid == os.geteuid():  # the worker's own engine: what it was started with
            folders += [os.environ.get(name, "") for name in ("HOME", "XDG_RUNTIME_DIR")]
    return tuple(sorted({os.path.normpath(f) for f in folders if f.startswith("/") and f != "/"}))


def split_cdi(devices: Any) -> tuple[Any, list[str]]:
    """``HostConfig.Devices`` without the CDI names the provider writes (``name:name:rwm``), and those names."""
    if not isinstance(devices, list):
        return devices, []
    rest, names = [], []
    for device in devices:
        members = {str(k).casefold(): v for k, v in device.items()} if isinstance(device, Mapping) else {}
        name = str(members.get("pathonhost", ""))
        exact = {"pathonhost": name, "pathincontainer": name, "cgrouppermissions": "rwm"}
        if len(members) == len(device) and CDI_NAME.fullmatch(name) and members == exact:
            names.append(name)
        else:
            rest.append(device)
    return rest, names

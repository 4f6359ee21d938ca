"""The plugin's policy: ``[gpu_policy]`` from a file only root can change, read as the workers read theirs.

The file (``--policy FILE``) is an INI file with the ``[gpu_policy]`` section of the workers' ``airflow.cfg`` (a copy,
or ``airflow.cfg`` itself where only root may write it), and, where the workers set them, ``[gpu] state_dir`` and
``[gpu] checkpoint_root`` (the folders the provider mounts: its task files, its checkpoints). It is refused unless it
and every folder above it are root's, no link, and writable by neither group nor others: a policy the workers' user
could rewrite is none (a DAG file's code runs as that user). The section is read by the one reader every process uses
(``config/policy.py``), with ``configparser`` as Airflow reads ``airflow.cfg``; no environment variable is read, so a
value naming one (``$HOME``, ``~``) is refused: the workers would expand it, the plugin could not.
"""

from __future__ import annotations

import configparser
import logging
import os
import pwd
import stat
from types import SimpleNamespace
from typing import Any

from airflow_gpu_provider.config.policy import SECTION, read

log = logging.getLogger("airflow_gpu_provider.authz")


class PolicyFileError(Exception):
    """The policy file cannot be trusted or read, and why."""


def root_only(path: str) -> None:
    """Refuse ``path`` unless it and every folder above it are root's, no link, writable by no group or other.

    :raises PolicyFileError: naming the component and what is wrong with it
    """
    if not path.startswith("/"):
        raise PolicyFileError(f"{path!r} is not an absolute path")
    parts = [part for part in path.split("/") if part]
    for depth in range(len(parts) + 1):
        current = "/" + "/".join(parts[:depth])
        try:
            info = os.lstat(current)
        except OSError as err:
            raise PolicyFileError(f"{current}: {err.strerror}") from None
        if stat.S_ISLNK(info.st_mode):
            raise PolicyFileError(f"{current} is a symbolic link: give the path itself")
        if info.st_uid != 0:
            raise PolicyFileError(f"{current} belongs to uid {info.st_uid}, not root: its owner could rewrite it")
        if info.st_mode & 0o022:
            raise PolicyFileError(f"{current} is writable by its group or others (mode {info.st_mode & 0o7777:04o})")


def _parse(text: str, path: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser()  # the interpolation Airflow's configuration uses ('%%' for '%')
    try:
        parser.read_string(text, source=path)
    except configparser.Error as err:
        raise PolicyFileError(f"{path}: {err}") from None
    return parser


def load(path: str, worker_uid: int) -> SimpleNamespace:
    """The policy in ``path``, as ``Policy.of`` takes it, for workers running as ``worker_uid``.

    :raises PolicyFileError: when the file is not root's alone, is not INI, or names a variable
    """
    root_only(path)
    descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(descriptor, encoding="utf-8") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            raise PolicyFileError(f"{path} is not a regular file")
        parser = _parse(handle.read(), path)
    if not parser.has_section(SECTION):
        raise PolicyFileError(f"{path} has no [{SECTION}] section")

    def lookup(section: str, option: str) -> str | None:
        try:
            value = parser.get(section, option, fallback=None)
        except configparser.Error as err:
            raise PolicyFileError(f"{path}: [{section}] {option}: {err}") from None
        if value is not None and ("$" in value or value.strip().startswith("~")):
            raise PolicyFileError(f"{path}: [{section}] {option}={value!r} names a variable, which no one expands here")
        return value

    values: dict[str, Any] = read(lookup, lambda message: log.warning("%s: %s", path, message))
    if not values["deployment"]:
        raise PolicyFileError(f"{path}: [{SECTION}] deployment is required (the workers' too: the same name)")
    values["state_dir"] = (lookup("gpu", "state_dir") or "").strip() or default_state_dir(worker_uid)
    values["checkpoint_root"] = (lookup("gpu", "checkpoint_root") or "").strip()
    return SimpleNamespace(**values)


def default_state_dir(uid: int) -> str:
    """``[gpu] state_dir``'s default for a worker running as ``uid``: in its passwd entry's home."""
    try:
        home = pwd.getpwuid(uid).pw_dir.rstrip("/")
    except KeyError:
        raise PolicyFileError(f"uid {uid} has no passwd entry: set [gpu] state_dir in the policy file") from None
    return f"{home}/.local/state/airflow-gpu-provider"

"""What of the worker a derived image's build may read: only what the admin allows, and nothing secret.

Rule B1 (docs/security.md: a build reads of the worker only what the admin allows): a derived image keeps what its build
copies in, on the engine and in the image registry, for whoever may pull it. So the worker files a task names for
its build (``ImageSettings.find_links`` folders, ``backend_options['ca_bundle']``) must lie beneath ``[gpu_policy]
allowed_build_paths``, be resolved as stable paths (``policy/paths.py``: no symbolic link on the way, every folder
root's or the worker's and writable by no one else), be a regular file (a CA bundle) or a folder (a wheel folder: its
regular files are copied, nothing else), and be readable by every local user already (the file and every folder on the
way): a file only root or the worker may read is a secret, and a build does not publish it. The admin's own ``[gpu]
ca_bundle`` is always allowed, as it is.

Checked at DAG parse (:func:`check_image_inputs`, from ``DockerOptions.check_image``: by name, and the files
themselves when the DAG processor has them) and again on the worker before anything is read or copied
(:func:`readable_input`): the files may differ there.
"""

from __future__ import annotations

import os
import stat
from typing import TYPE_CHECKING, Any, NamedTuple
from urllib.parse import urlparse

from airflow_gpu_provider.exceptions import InvalidSettingError
from airflow_gpu_provider.policy import Policy, PolicyError
from airflow_gpu_provider.policy.paths import UnsafePathError, beneath, components, stable

if TYPE_CHECKING:
    from airflow_gpu_provider.config.worker import GpuConfig
    from airflow_gpu_provider.settings import ImageSettings

OPTION = "allowed_build_paths"
CA_FIELD = "backend_options['ca_bundle']"


class BuildPolicy(NamedTuple):
    """What a build may read: ``[gpu_policy] allowed_build_paths``, and the admin's CA bundle (the connection's)."""

    roots: tuple[str, ...]
    ca_bundle: str | None

    @classmethod
    def of(cls, conf: GpuConfig | Any, ca_bundle: str | None = None) -> BuildPolicy:
        """The build policy of a configuration (``GpuConfig``, or anything with its attributes).

        :param ca_bundle: the admin's CA bundle: the Docker connection's extra ``ca_bundle``
        """
        return cls(Policy.of(conf).build_paths, ca_bundle or None)

    @classmethod
    def current(cls) -> BuildPolicy:
        """The build policy of this process's ``[gpu]`` section (at DAG parse, the DAG processor's).

        No connection is read at parse: the admin's CA bundle is known here only from the removed ``[gpu] ca_bundle``.
        """
        from airflow_gpu_provider import config
        from airflow_gpu_provider.config.worker import GpuConfig

        return cls.of(GpuConfig.read(), config.deprecated("ca_bundle"))

    @property
    def allow(self) -> str:
        """The allowed roots, in words."""
        return ", ".join(self.roots) or "nothing (empty)"


def local_directory(link: str) -> str | None:
    """The worker folder a ``find_links`` entry names, or ``None`` for a remote URL.

    :raises InvalidSettingError: when it is neither an absolute path nor a URL
    """
    parsed = urlparse(link)
    if parsed.scheme in ("http", "https"):
        return None
    path = parsed.path if parsed.scheme == "file" else link
    if not os.path.isabs(path):
        raise InvalidSettingError(
            "ImageSettings", "find_links", link, "not an absolute path or URL", "'/abs/wheel/dir' or 'https://...'"
        )
    return path


def _others_may_read(path: str, info: os.stat_result) -> str | None:
    """Why ``path`` (stable, of ``info``) is not readable by every local user, or ``None``."""
    wanted = stat.S_IROTH | (stat.S_IXOTH if stat.S_ISDIR(info.st_mode) else 0)
    if info.st_mode & wanted != wanted:
        return f"only its owner or group may read it (mode {stat.S_IMODE(info.st_mode):04o}): it may be a secret"
    parts = components(path)
    for depth in range(len(parts)):
        folder = "/" + "/".join(parts[:depth])
        if not os.stat(folder).st_mode & stat.S_IXOTH:  # stable: the name still names what was checked
            return f"{folder} is closed to other users: what lies in it may be a secret"
    return None


def readable_input(
    path: str, *, directory: bool, owner: str, field: str, policy: BuildPolicy, value: str | None = None
) -> list[str]:
    """Check a worker path a build would read; return, for a folder, the names of the regular files it copies.

    :param value: the value as the task gave it (a ``file://`` URL), for the error
    :raises PolicyError: when it is not beneath ``allowed_build_paths``, or could be redirected, or is not a
        regular file (a folder), or not every local user may read it
    :raises FileNotFoundError: when it does not exist
    """
    value = value or path

    def refuse(reason: str) -> PolicyError:
        return PolicyError(owner, field, value, reason, option=OPTION, allow=policy.allow)

    try:
        clean = "/" + "/".join(components(path))
    except UnsafePathError as err:
        raise refuse(err.problem) from None
    if not any(beneath(clean, root) for root in policy.roots):
        raise refuse("a derived image's build may read only worker files beneath the admin's allowed paths")
    try:
        info = stable(clean, directory=directory)
    except UnsafePathError as err:
        raise refuse(f"{err.path}: {err.problem}") from None
    problem = _others_may_read(clean, info)
    if problem:
        raise refuse(problem)
    if not directory:
        return []
    names = []
    for entry in sorted(os.scandir(clean), key=lambda entry: entry.name):
        entry_info = entry.stat(follow_symlinks=False)
        if not stat.S_ISREG(entry_info.st_mode):
            continue  # links and folders in a wheel folder are not copied
        if not entry_info.st_mode & stat.S_IROTH:
            raise refuse(f"{entry.path} is readable by its owner or group only: it may be a secret")
        names.append(entry.name)
    return names


def check_image_inputs(image: ImageSettings, ca_bundle: str | None, policy: BuildPolicy | None = None) -> None:
    """At DAG parse: refuse the worker files a build would read that ``allowed_build_paths`` does not allow.

    Nothing is read without requirements (no build). A path missing here is checked by name only: the worker
    checks the files themselves before its build.

    :param ca_bundle: the task's ``backend_options['ca_bundle']``
    :raises PolicyError: naming the field, the value and ``[gpu_policy] allowed_build_paths``
    """
    if not image.requirements:
        return
    policy = policy or BuildPolicy.current()
    inputs = [(link, local_directory(link), "ImageSettings", "find_links", True) for link in image.find_links]
    if ca_bundle and ca_bundle != policy.ca_bundle:
        inputs.append((ca_bundle, ca_bundle, "backend 'docker'", CA_FIELD, False))
    for value, path, owner, field, directory in inputs:
        if path is None:
            continue
        try:
            readable_input(path, directory=directory, owner=owner, field=field, policy=policy, value=value)
        except FileNotFoundError:
            continue  # not on this host: the worker checks it

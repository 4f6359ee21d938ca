"""A task's requirements, installed by the runtime (``runtime.pyz install ...``, :func:`install_main`).

What the local backend's venvs, Kubernetes init containers and the install stage of Docker's derived images run.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

from .output import say
from .protocol import PREFIX, InstallError, redact, split_credentials, uv_ca_variable


def _run_installer(argv: list[str], emit: Callable[[str], None], environ: dict[str, str] | None = None) -> str:
    """Run one installer command, each line of its output to ``emit``; raise with the tail on failure."""
    import subprocess

    emit(redact(f"$ {' '.join(argv)}"))
    process = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=environ or dict(os.environ)
    )
    assert process.stdout is not None
    lines = []
    try:
        for line in process.stdout:
            lines.append(redact(line.rstrip()))
            emit(f"  {lines[-1]}")
    finally:
        if process.poll() is None:
            process.kill()
        status = process.wait()
    if status != 0:
        tail = "\n".join(lines[-20:])
        raise InstallError(f"{argv[0]} {' '.join(argv[1:3])} failed with exit status {status}:\n{tail}")
    return "\n".join(lines)


def _uv_from_pip(emit: Callable[[str], None], version: str | None = None) -> str:
    """The uv binary for an image that has none: pip-installed into a temporary folder (``version``, else latest)."""
    target = os.path.join(os.environ.get("TMPDIR", "/tmp"), "airflow-gpu-uv")
    uv = f"uv=={version}" if version else "uv"
    _run_installer([sys.executable, "-m", "pip", "install", "--quiet", "--target", target, uv], emit)
    return os.path.join(target, "bin", "uv")


def install_requirements(
    requirements: list[str],
    index_args: list[str],
    *,
    installer: str,
    python: str,
    target: str | None = None,
    resolve_with: str | None = None,
    uv: str | None = None,
    uv_version: str | None = None,
    emit: Callable[[str], None] = print,
    where: str = "the environment",
) -> None:
    """Install ``requirements`` for ``python`` (into ``target`` with ``--target``, else into its environment).

    uv installs only what is missing: ``uv pip install --dry-run`` against ``resolve_with`` (default ``python``)
    lists the missing packages as exact pins, and those alone are installed with ``--no-deps``, so a requirement
    like ``accelerate`` never brings a second torch next to the one already there. pip installs what ``python``
    does not see yet. Credentials in index URLs go to a private netrc file for the installers' time only.

    :param uv: the uv binary (default: ``uv`` on the PATH, else pip-installed first)
    :param uv_version: the uv version to pip-install when there is none
    :param emit: receives each line of the installers' output
    :param where: what ``resolve_with`` is, for the log ("the image", "the worker environment")
    :raises InstallError: when an installer fails
    """
    import shutil
    import tempfile

    index_args, netrc = split_credentials(index_args)
    environ = {**os.environ}
    secrets = tempfile.mkdtemp(prefix="airflow-gpu-netrc-") if netrc else None  # 0700
    try:
        if secrets is not None:
            environ["NETRC"] = os.path.join(secrets, "netrc")
            descriptor = os.open(environ["NETRC"], os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(descriptor, "w") as handle:
                handle.write(netrc)
        into = ["--target", target] if target else []
        if installer == "pip":
            pip = [python, "-m", "pip", "install", "--disable-pip-version-check", *into, *index_args, *requirements]
            _run_installer(pip, emit, environ)
            return
        uv = uv or shutil.which("uv") or _uv_from_pip(emit, uv_version)
        environ.setdefault(uv_ca_variable(_run_installer([uv, "--version"], lambda _: None)), "1")  # system CA store
        resolve = [uv, "pip", "install", "--dry-run", "--break-system-packages", "--python", resolve_with or python]
        plan = _run_installer([*resolve, *index_args, *requirements], emit, environ)
        pins = [line.strip()[2:].strip() for line in plan.splitlines() if line.strip().startswith("+ ")]
        if not pins:
            emit(f"{where} already satisfies every requirement")
            return
        _run_installer(
            [uv, "pip", "install", "--no-deps", "--python", python, *into, *index_args, *pins], emit, environ
        )
    finally:
        if secrets is not None:
            shutil.rmtree(secrets, ignore_errors=True)


OPTIONS = {
    "--python": "python", "--resolve-with": "resolve_with", "--uv": "uv", "--uv-version": "uv_version",
    "--where": "where",
}  # fmt: skip


def install_main(argv: list[str]) -> int:
    """``[OPTIONS] TARGET INSTALLER [INDEX ARGS...] -- REQUIREMENTS...``: install the requirements.

    TARGET is the folder to install into (``--target``), or ``-`` for the environment of the Python. OPTIONS, each
    with a value: ``--python`` (default: this Python), ``--resolve-with`` (what uv resolves against; default: the
    Python), ``--uv`` (the uv binary), ``--uv-version`` (the version to pip-install when there is no uv), ``--where``
    (what is resolved against, for the log; default "the image").
    Index credentials come in the netrc file named by ``NETRC``, never in the arguments.
    """
    settings = {"python": sys.executable, "where": "the image"}
    while argv and argv[0] in OPTIONS:
        settings[OPTIONS[argv[0]]], argv = argv[1], argv[2:]
    target, installer, rest = argv[0], argv[1], argv[2:]
    index_args, requirements = rest[: rest.index("--")], rest[rest.index("--") + 1 :]
    try:
        install_requirements(
            requirements, index_args, installer=installer, target=None if target == "-" else target,
            emit=lambda line: say(f"{PREFIX} {line}"), **settings,
        )  # fmt: skip
    except InstallError as exc:
        say(f"{PREFIX} {exc}", stderr=True)
        return 1
    return 0

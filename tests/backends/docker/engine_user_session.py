"""Tests on an engine of the worker's own user, run from a root session: in one pytest session of that user.

On such an engine the worker must be the engine's user (``user_engines.py``). A root session (CI) hands every item
that asks ``docker_engine`` for ``rootless`` or ``podman`` to ONE pytest session of that user per engine, run the
first time such an item is called, and reports each item's outcome there as its own (:func:`pytest_pyfunc_call`).
Where root's home hides the interpreter from that user, that session runs in a mount namespace of its own where it
does not (:func:`_reachable`). Everything it writes (Airflow's home, pytest's folders) lies in the engine's folder.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from backends.docker.user_engines import INNER, KINDS, UserEngine, _as_user

RESULTS = "AIRFLOW_GPU_USER_ENGINE_RESULTS"  # where that session writes its outcomes
REPO = Path(__file__).resolve().parents[3]


def delegated(item: pytest.Item) -> str | None:
    """The engine kind whose user's session runs this item instead of this (root) one, or ``None``."""
    callspec = getattr(item, "callspec", None)
    kind = callspec.params.get("docker_engine") if callspec is not None else None
    return kind if kind in KINDS and os.geteuid() == 0 else None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A delegated item may wait for the whole engine user's session (the first one runs it)."""
    for item in items:
        if delegated(item):
            item.add_marker(pytest.mark.timeout(1800))


def _bare(item: pytest.Item) -> str:
    """The item's node id without the ``@group`` that ``--dist loadgroup`` appends (the user's session has none)."""
    groups = sorted({str(mark.args[0]) for mark in item.iter_markers("xdist_group") if mark.args})
    suffix = "@" + "_".join(groups)
    return item.nodeid.removesuffix(suffix) if groups else item.nodeid


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """In a root session, an item on an engine of the worker's user: its outcome in that user's session."""
    kind = delegated(pyfuncitem)
    if kind is None:
        return None
    engine: UserEngine = pyfuncitem._request.getfixturevalue(f"{kind}_engine")
    if engine.outcomes is None:
        items = [_bare(item) for item in pyfuncitem.session.items if delegated(item) == kind]
        engine.outcomes = _engine_user_session(engine, items)
    outcome = engine.outcomes.get(_bare(pyfuncitem))
    if outcome is None:
        pytest.fail(f"the {kind} engine user's session did not report it:\n{engine.outcomes.get('', {})}")
    if outcome["outcome"] == "skipped":
        pytest.skip(f"in the engine user's session: {outcome['text']}")
    if outcome["outcome"] == "failed":
        pytest.fail(f"in the {kind} engine user's session ({engine.user}):\n{outcome['text']}", pytrace=False)
    return True


def _engine_user_session(engine: UserEngine, nodeids: list[str]) -> dict[str, dict[str, Any]]:
    """Run these items in one pytest session of the engine's user, on that engine; their outcomes by node id."""
    assert engine.root is not None
    entry = pwd.getpwnam(engine.user)
    home = engine.root / "worker"  # its HOME and TMPDIR (Airflow's home, pytest's folders): removed with the engine
    for folder in (home, home / "tmp"):  # readable by others: a build's inputs must be (policy/build.py)
        folder.mkdir()
        folder.chmod(0o755)
        os.chown(folder, entry.pw_uid, entry.pw_gid)
    results = home / "results.jsonl"
    keep = ("PATH", "LANG", "LC_ALL", "CI", "AIRFLOW_GPU_REQUIRE_DOCKER", "AIRFLOW_GPU_TEST_BASE_IMAGE", "TZ")
    env = {key: os.environ[key] for key in keep if key in os.environ}
    env.update({"HOME": str(home), INNER: f"{engine.kind}={engine.url}", RESULTS: str(results), "DOCKER_HOST": engine.url,
                "PYTHONDONTWRITEBYTECODE": "1", "TMPDIR": str(home / "tmp")})  # fmt: skip
    command = _as_user(entry, [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *nodeids], env)
    hidden = _reachable(
        entry, [Path(sys.executable).resolve(), Path(sys.base_prefix).resolve(), Path(sys.prefix), REPO]
    )
    if hidden:
        kept = sorted({path for paths in hidden.values() for path in paths})
        command = ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", REVEAL, "sh",
                   str(engine.root / "keep"), *hidden, "--", *kept, "--", *command]  # fmt: skip
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=1500, check=False)
    outcomes: dict[str, dict[str, Any]] = {"": {"outcome": "failed", "text": (done.stdout + done.stderr)[-4000:]}}
    with contextlib.suppress(OSError):
        for line in results.read_text().splitlines():
            report = json.loads(line)
            known = outcomes.setdefault(report["nodeid"], {"outcome": "passed", "text": ""})
            if report["outcome"] != "passed" and known["outcome"] != "failed":
                known.update(outcome=report["outcome"], text=report["text"])
    return outcomes


# In a mount namespace of its own: each hidden folder (root's home, say) becomes an empty tmpfs holding only the
# folders the session needs, bound back from where they were. Arguments: a scratch folder, the hidden folders, --,
# the kept ones, --, the command.
REVEAL = """set -e
keep=$1; shift; hidden=""; kept=""
while [ "$1" != -- ]; do hidden="$hidden $1"; shift; done; shift
while [ "$1" != -- ]; do kept="$kept $1"; shift; done; shift
for k in $kept; do mkdir -p "$keep$k"; mount --bind "$k" "$keep$k"; done
for h in $hidden; do mount -t tmpfs -o mode=755,size=1m tmpfs "$h"; done
for k in $kept; do mkdir -p "$k"; mount --move "$keep$k" "$k"; done
exec "$@"
"""


def _reachable(entry: pwd.struct_passwd, paths: list[Path]) -> dict[str, list[str]]:
    """The folders on the way to ``paths`` that ``entry`` may not enter, each with its child that leads on."""
    groups = {entry.pw_gid, *os.getgrouplist(entry.pw_name, entry.pw_gid)}
    hidden: dict[str, list[str]] = {}
    for path in paths:
        for folder in [*reversed(path.parents), path][:-1]:
            info = folder.stat()
            bit = 0o100 if info.st_uid == entry.pw_uid else 0o010 if info.st_gid in groups else 0o001
            if not info.st_mode & bit:
                child = str(path.relative_to(folder).parts[0])
                hidden.setdefault(str(folder), [])
                if f"{folder}/{child}" not in hidden[str(folder)]:
                    hidden[str(folder)].append(f"{folder}/{child}")
                break
    return hidden


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """In the engine user's session: each phase's outcome, for the root session that started it."""
    path = os.environ.get(RESULTS)
    if not path or (report.when != "call" and report.outcome == "passed"):
        return
    text = str(report.longrepr)[-6000:] if report.longrepr else ""
    if report.skipped and isinstance(report.longrepr, tuple):
        text = str(report.longrepr[2])
    with open(path, "a") as handle:
        handle.write(json.dumps({"nodeid": report.nodeid, "outcome": report.outcome, "text": text}) + "\n")

"""The runtime half of checkpoints: the task's folder, what a resume loads and when, a URI folder staged locally.

The worker decides the folder (``AIRFLOW_GPU_CHECKPOINT_DIR``, a path or a URI) and whether to resume; here the
newest complete ``accelerator.save_state`` is found, loaded after the first ``Accelerator.prepare``, and, for a URI,
downloaded first and each later save uploaded.
"""

from __future__ import annotations

import os
from typing import Any

from .protocol import CHECKPOINT_ENV, CHECKPOINT_URI_ENV, PREFIX, RESUME_FROM_ENV, RESUME_STEP_ENV, redact

CHECKPOINT_MARKER = "random_states_0.pkl"  # the last file accelerator.save_state writes (process 0's RNG states)


def newest_checkpoint(folder: str) -> tuple[str, int | None] | None:
    """The newest complete ``accelerator.save_state`` folder in ``folder`` or its ``checkpoints/``, and its number.

    Newest as Accelerate's own ``load_state`` picks it: the highest first number in the folder's name
    (``checkpoint_12``, ``epoch_3``), then the latest written; a folder without :data:`CHECKPOINT_MARKER` was cut off
    while being saved and is skipped.
    """
    import re

    found = []
    for parent in (folder, os.path.join(folder, "checkpoints")):
        try:
            names = os.listdir(parent)
        except OSError:
            continue
        for name in names:
            path = os.path.join(parent, name)
            if os.path.isfile(os.path.join(path, CHECKPOINT_MARKER)):
                numbers = re.findall(r"[0-9]+", name)
                found.append((int(numbers[0]) if numbers else -1, os.path.getmtime(path), path))
    if not found:
        return None
    number, _, path = max(found)
    return path, None if number < 0 else number


def prepare_checkpoint(envelope: dict[str, Any]) -> None:
    """Announce the task's checkpoint folder (made if missing); with ``resume``, find what to resume from.

    The newest checkpoint goes to ``AIRFLOW_GPU_RESUME_FROM`` and its number to ``AIRFLOW_GPU_RESUME_STEP``,
    for the function, a script and every rank of a launch.
    """
    for name in (RESUME_FROM_ENV, RESUME_STEP_ENV):
        os.environ.pop(name, None)  # only this try's own lookup counts
    folder = os.environ.get(CHECKPOINT_ENV)
    if not folder:
        if envelope.get("resume"):
            print(f"{PREFIX} resume: the task has no checkpoint folder, so it starts afresh", flush=True)
        return
    if "://" not in folder:
        os.makedirs(folder, exist_ok=True)
    print(f"{PREFIX} checkpoint folder ({CHECKPOINT_ENV}): {redact(folder)}", flush=True)
    if not envelope.get("resume"):
        return
    if "://" in folder:
        try:
            folder = stage_from_uri(folder)
        except Exception as exc:  # noqa: BLE001 - no fsspec, no credentials: the task starts afresh, and says why
            why = redact(f"{folder} ({type(exc).__name__}: {exc})")  # an error may repeat the URI's keys
            print(f"{PREFIX} resume: cannot read {why}; fsspec and the store's credentials must be in the task's "
                  "environment. Starting afresh", flush=True)  # fmt: skip
            return
    found = newest_checkpoint(folder)
    if found is None:
        print(f"{PREFIX} resume: no checkpoint in {redact(folder)} yet, so the task starts afresh", flush=True)
        return
    path, number = found
    os.environ[RESUME_FROM_ENV] = path
    if number is not None:
        os.environ[RESUME_STEP_ENV] = str(number)
    print(f"{PREFIX} resume: from {path} (step {number}), loaded after the first accelerator.prepare()", flush=True)


STAGES: list[str] = []  # local copies of URI checkpoint folders, removed when this process ends


def drop_stages() -> None:
    """Remove the local copies of URI checkpoint folders (at exit, and before a SIGTERM ends the process)."""
    import shutil

    for stage in STAGES:
        shutil.rmtree(stage, ignore_errors=True)


def stage_from_uri(uri: str) -> str:
    """A local folder standing for the URI folder: the newest complete checkpoint there is downloaded into it.

    ``AIRFLOW_GPU_CHECKPOINT_DIR`` becomes that folder (Accelerate saves to local paths) and
    ``AIRFLOW_GPU_CHECKPOINT_URI`` the URI; :func:`upload_saves` copies each ``save_state`` back. Needs fsspec (and
    the store's own package and credentials) in the task's environment.
    """
    import atexit
    import re
    import tempfile

    import fsspec

    fs, root = fsspec.core.url_to_fs(uri)
    stage = tempfile.mkdtemp(prefix="airflow-gpu-checkpoint-")
    if not STAGES:
        atexit.register(drop_stages)
    STAGES.append(stage)
    found = []
    for sub in ("", "checkpoints"):
        try:
            entries = fs.ls(f"{root.rstrip('/')}/{sub}".rstrip("/"), detail=True)
        except (FileNotFoundError, NotADirectoryError):
            continue
        for entry in entries:
            name = entry["name"].rstrip("/").rsplit("/", 1)[-1]
            if entry["type"] == "directory" and fs.exists(f"{entry['name'].rstrip('/')}/{CHECKPOINT_MARKER}"):
                numbers = re.findall(r"[0-9]+", name)
                found.append((int(numbers[0]) if numbers else -1, name, sub, entry["name"].rstrip("/")))
    if found:
        _, name, sub, remote = max(found)
        fs.get(f"{remote}/", f"{os.path.join(stage, sub, name)}/", recursive=True)
        print(f"{PREFIX} resume: downloaded {redact(uri.rstrip('/'))}/{os.path.join(sub, name)}", flush=True)
    os.environ[CHECKPOINT_ENV], os.environ[CHECKPOINT_URI_ENV] = stage, uri
    print(f"{PREFIX} checkpoint folder staged locally ({CHECKPOINT_ENV}): {stage}", flush=True)
    return stage


def upload_saves() -> None:
    """With a staged URI folder: after each ``Accelerator.save_state`` into it, the saved folder is uploaded.

    Every process waits for the others to finish saving; one process per machine uploads (the ranks' files of a
    machine lie on its disk).
    """
    uri, stage = os.environ.get(CHECKPOINT_URI_ENV), os.environ.get(CHECKPOINT_ENV)
    if not uri or not stage:
        return
    import functools

    try:
        import fsspec
        from accelerate import Accelerator
    except Exception as exc:  # noqa: BLE001 - the function reports its own import errors
        why = redact(f"{uri}: {type(exc).__name__}: {exc}")
        print(f"{PREFIX} checkpoints stay in {stage}, not uploaded to {why}", flush=True)
        return
    original = Accelerator.save_state

    @functools.wraps(original)
    def save_state(self: Any, *args: Any, **kwargs: Any) -> Any:
        saved = str(original(self, *args, **kwargs))
        self.wait_for_everyone()
        relative = os.path.relpath(saved, stage)
        if self.is_local_main_process and not relative.startswith(".."):
            fs, root = fsspec.core.url_to_fs(uri)
            fs.put(f"{saved}/", f"{root.rstrip('/')}/{relative}/", recursive=True)
            print(f"{PREFIX} uploaded {relative} to {redact(uri)}", flush=True)
        self.wait_for_everyone()
        return saved

    Accelerator.save_state = save_state


def resume_after_prepare() -> None:
    """Make the first ``Accelerator.prepare`` of this process load ``AIRFLOW_GPU_RESUME_FROM`` before returning.

    So the user's loop starts from the restored model, optimizer, scheduler, dataloader and RNG states; with
    ``AIRFLOW_GPU_RESUME_STEP`` = N, ``accelerator.project_configuration.iteration`` becomes N + 1 (the next
    automatically named checkpoint is ``checkpoint_<N+1>``, and a loop that saves once per epoch starts there).
    """
    path = os.environ.get(RESUME_FROM_ENV)
    if not path:
        return
    try:
        from accelerate import Accelerator
    except Exception as exc:  # noqa: BLE001 - the function reports its own import errors
        print(f"{PREFIX} resume: accelerate cannot be imported here ({exc}); load {path} yourself", flush=True)
        return
    import functools

    original = Accelerator.prepare
    step = os.environ.get(RESUME_STEP_ENV)

    @functools.wraps(original)
    def prepare(self: Any, *args: Any, **kwargs: Any) -> Any:
        prepared = original(self, *args, **kwargs)
        if Accelerator.prepare is prepare:  # the first call only
            Accelerator.prepare = original
            self.load_state(path)
            if step is not None:
                self.project_configuration.iteration = int(step) + 1
            print(f"{PREFIX} rank {self.process_index}: resumed from {path}", flush=True)
        return prepared

    Accelerator.prepare = prepare

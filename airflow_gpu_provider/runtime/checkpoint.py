"""The runtime half of checkpoints: the task's folder, what a resume finds, a URI folder staged locally.

The worker decides the folder (``AIRFLOW_GPU_CHECKPOINT_DIR``, a path or a URI) and whether to resume; here the
newest complete checkpoint is found (an ``accelerator.save_state`` folder or a Hugging Face Trainer's
``checkpoint-N``) and exported; a function's ``save_state`` checkpoint is loaded after its first
``Accelerator.prepare`` (``resuming.py``), and, for a URI, downloaded first and each later save uploaded.
"""

from __future__ import annotations

import os
import re
from typing import Any, NamedTuple

from .protocol import CHECKPOINT_ENV, CHECKPOINT_URI_ENV, PREFIX, RESUME_FROM_ENV, RESUME_STEP_ENV, redact

CHECKPOINT_MARKER = "random_states_0.pkl"  # the last file accelerator.save_state writes (process 0's RNG states)
TRAINER_MARKER = "trainer_state.json"  # the last file a Hugging Face Trainer writes into its checkpoint-N folder
TRAINER_NAME = re.compile(r"checkpoint-([0-9]+)")  # Trainer's folder names: checkpoint-<global step>
ACCELERATE, TRAINER = "accelerate", "trainer"  # the kinds of checkpoint a resume finds
LOAD_WITH = {
    TRAINER: "pass it on: trainer.train(resume_from_checkpoint=os.environ.get('AIRFLOW_GPU_RESUME_FROM'))",
    "script": "the script loads it: airflow_gpu_runtime.resume(accelerator) after its accelerator.prepare(...)",
    "callable": "loaded after the function's first accelerator.prepare()",
}


class Checkpoint(NamedTuple):
    """A complete checkpoint: its folder, the number in its name (``checkpoint_2``: 2) and its kind."""

    path: str
    number: int | None
    kind: str


def checkpoint_kind(name: str, has: Any) -> str | None:
    """The kind of the folder ``name``, ``None`` for none or one cut off while being saved.

    :param has: whether the folder holds a file (``has("trainer_state.json")``), on a disk or in a store
    """
    if has(CHECKPOINT_MARKER):
        return ACCELERATE
    if TRAINER_NAME.fullmatch(name) and has(TRAINER_MARKER):
        return TRAINER
    return None


def checkpoint_number(name: str) -> int | None:
    """The first number in a checkpoint folder's name, as Accelerate's ``load_state`` reads it."""
    numbers = re.findall(r"[0-9]+", name)
    return int(numbers[0]) if numbers else None


def newest_checkpoint(folder: str) -> Checkpoint | None:
    """The newest complete checkpoint in ``folder`` or its ``checkpoints/``.

    Newest as Accelerate's own ``load_state`` and Trainer's ``get_last_checkpoint`` pick it: the highest first
    number in the folder's name (``checkpoint_12``, ``epoch_3``, ``checkpoint-500``), then the latest written. A
    folder without its kind's last file (:data:`CHECKPOINT_MARKER`, :data:`TRAINER_MARKER`) was cut off while being
    saved and is skipped.
    """
    found = []
    for parent in (folder, os.path.join(folder, "checkpoints")):
        try:
            names = os.listdir(parent)
        except OSError:
            continue
        for name in names:
            path = os.path.join(parent, name)
            kind = checkpoint_kind(name, lambda file, path=path: os.path.isfile(os.path.join(path, file)))
            if kind is not None:
                number = checkpoint_number(name)
                found.append((-1 if number is None else number, os.path.getmtime(path), path, kind))
    if not found:
        return None
    number, _, path, kind = max(found)
    return Checkpoint(path, None if number < 0 else number, kind)


def prepare_checkpoint(envelope: dict[str, Any]) -> None:
    """Announce the task's checkpoint folder (made if missing); with ``resume``, find what to resume from.

    The newest checkpoint goes to ``AIRFLOW_GPU_RESUME_FROM`` and its number to ``AIRFLOW_GPU_RESUME_STEP``,
    for the function, a script and every rank of a launch; the log says who loads it.
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
    path, number, kind = found
    os.environ[RESUME_FROM_ENV] = path
    if number is not None:
        os.environ[RESUME_STEP_ENV] = str(number)
    how = LOAD_WITH[TRAINER if kind == TRAINER else "callable" if envelope["mode"] == "callable" else "script"]
    what = "a Trainer checkpoint" if kind == TRAINER else "an accelerator.save_state checkpoint"
    print(f"{PREFIX} resume: from {path} (step {number}; {what}, in {RESUME_FROM_ENV}): {how}", flush=True)


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
            remote = entry["name"].rstrip("/")
            name = remote.rsplit("/", 1)[-1]
            if entry["type"] == "directory" and checkpoint_kind(name, lambda file, r=remote: fs.exists(f"{r}/{file}")):
                number = checkpoint_number(name)
                found.append((-1 if number is None else number, name, sub, remote))
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
    machine lie on its disk). Called by the runtime before a function runs and by :func:`~.resuming.resume` in a
    script; once per process.
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
    if getattr(original, "uploads", False):
        return

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

    save_state.uploads = True  # type: ignore[attr-defined]
    Accelerator.save_state = save_state

"""The runtime half of checkpoints: the task's folder, what a resume finds, a URI folder staged locally.

The worker decides the folder (``AIRFLOW_GPU_CHECKPOINT_DIR``, a path or a URI) and whether to resume; here the
newest complete checkpoint is found (an ``accelerator.save_state`` folder, a Hugging Face Trainer's
``checkpoint-N``, a Lightning ``*.ckpt`` or a ``torch.save`` file) and exported; a function's ``save_state``
checkpoint is loaded after its first ``Accelerator.prepare`` (``resuming.py``), and, for a URI, downloaded first and
each later save uploaded.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

from .output import say
from .protocol import CHECKPOINT_ENV, CHECKPOINT_URI_ENV, PREFIX, RESUME_FROM_ENV, RESUME_STEP_ENV, redact

CHECKPOINT_MARKER = "random_states_0.pkl"  # the last file accelerator.save_state writes (process 0's RNG states)
TRAINER_MARKER = "trainer_state.json"  # the last file a Hugging Face Trainer writes into its checkpoint-N folder
TRAINER_NAME = re.compile(r"checkpoint-([0-9]+)")  # Trainer's folder names: checkpoint-<global step>
ACCELERATE, TRAINER, LIGHTNING, TORCH = "accelerate", "trainer", "lightning", "torch"  # what a resume finds
FILE_KINDS = {".ckpt": LIGHTNING, ".pt": TORCH, ".pth": TORCH}  # checkpoints in one file, by their suffix
WHAT = {
    ACCELERATE: "an accelerator.save_state checkpoint",
    TRAINER: "a Trainer checkpoint",
    LIGHTNING: "a Lightning checkpoint",
    TORCH: "a torch.save file",
}
LOAD_WITH = {
    TRAINER: "pass it on: trainer.train(resume_from_checkpoint=os.environ.get('AIRFLOW_GPU_RESUME_FROM'))",
    LIGHTNING: "pass it on: trainer.fit(model, ckpt_path=os.environ.get('AIRFLOW_GPU_RESUME_FROM'))",
    TORCH: "the task loads it: torch.load(os.environ['AIRFLOW_GPU_RESUME_FROM'])",
    "script": "the script loads it: airflow_gpu_runtime.resume(accelerator) after its accelerator.prepare(...)",
    "callable": "loaded after the function's first accelerator.prepare()",
}


class Checkpoint(NamedTuple):
    """A complete checkpoint: its folder or file, the number in its name (``checkpoint_2``: 2) and its kind."""

    path: str
    number: int | None
    kind: str

    @property
    def counted(self) -> str:
        """What the number in its name counts, in words: ``epoch 1`` (``epoch_1``), ``step 60`` (``step_60``).

        The word before the number, where it says what it counts; a save's number otherwise (``checkpoint_2``,
        ``checkpoint-500``: a step, as Accelerate and Trainer name them).
        """
        if self.number is None:
            return ""
        word = re.match(r"[A-Za-z]*", os.path.basename(self.path)).group().lower()  # type: ignore[union-attr]
        return f"{word if word in ('epoch', 'step', 'iter', 'iteration') else 'step'} {self.number}"


def checkpoint_kind(name: str, has: Any) -> str | None:
    """The kind of the folder ``name``, ``None`` for none or one cut off while being saved.

    :param has: whether the folder holds a file (``has("trainer_state.json")``), on a disk or in a store
    """
    if has(CHECKPOINT_MARKER):
        return ACCELERATE
    if TRAINER_NAME.fullmatch(name) and has(TRAINER_MARKER):
        return TRAINER
    return None


def file_kind(name: str, opens: Callable[[], Any]) -> str | None:
    """The kind of the file ``name`` (Lightning's ``*.ckpt``, ``torch.save``'s ``*.pt``), ``None`` for none.

    ``torch.save`` writes a zip archive whose directory comes last: a file without it was cut off while being saved.

    :param opens: opens the file to read its bytes, on a disk or in a store
    """
    import zipfile

    kind = FILE_KINDS.get(os.path.splitext(name)[1])
    try:
        with opens() as handle:
            return kind if kind is not None and zipfile.is_zipfile(handle) else None
    except OSError:
        return None


def checkpoint_number(name: str) -> int | None:
    """The first number in a checkpoint folder's name, as Accelerate's ``load_state`` reads it."""
    numbers = re.findall(r"[0-9]+", name)
    return int(numbers[0]) if numbers else None


def newest(found: Iterable[tuple[str, str, float]]) -> Checkpoint | None:
    """The newest of complete checkpoints, given as ``(path, kind, when it was written)``.

    Names that differ only in their numbers count the same thing (``checkpoint_2``, ``checkpoint_12``;
    ``epoch=1-step=16.ckpt``): of those, the highest number is the newest, as Accelerate's own ``load_state`` and
    Trainer's ``get_last_checkpoint`` pick it (a copy gives every folder the same time). Names that count different
    things (``step_60``, ``epoch_1``; ``last.ckpt``) are ordered by when they were written: the last one written is
    the newest.
    """
    best: dict[str, tuple[tuple[int, float], float, Checkpoint]] = {}
    for path, kind, written in found:
        name = os.path.basename(path)
        number = checkpoint_number(name)
        rank, counter = (-1 if number is None else number, written), re.sub(r"[0-9]+", "#", name)
        if counter not in best or rank > best[counter][0]:
            best[counter] = (rank, written, Checkpoint(path, number, kind))
    return max(best.values(), key=lambda candidate: candidate[1])[2] if best else None


def newest_checkpoint(folder: str) -> Checkpoint | None:
    """The newest complete checkpoint in ``folder`` or its ``checkpoints/`` (:func:`newest`).

    A folder without its kind's last file (:data:`CHECKPOINT_MARKER`, :data:`TRAINER_MARKER`), a file without its
    zip directory, was cut off while being saved and is skipped; the last file written dates a folder.
    """
    found = []
    for parent in (folder, os.path.join(folder, "checkpoints")):
        try:
            names = os.listdir(parent)
        except OSError:
            continue
        for name in names:
            path = os.path.join(parent, name)
            if os.path.isdir(path):
                kind = checkpoint_kind(name, lambda file, path=path: os.path.isfile(os.path.join(path, file)))
                last = os.path.join(path, CHECKPOINT_MARKER if kind == ACCELERATE else TRAINER_MARKER)
            else:
                kind, last = file_kind(name, functools.partial(open, path, "rb")), path
            if kind is not None:
                found.append((path, kind, os.path.getmtime(last)))
    return newest(found)


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
            say(f"{PREFIX} resume: the task has no checkpoint folder, so it starts afresh")
        return
    if "://" not in folder:
        os.makedirs(folder, exist_ok=True)
    say(f"{PREFIX} checkpoint folder ({CHECKPOINT_ENV}): {redact(folder)}")
    if not envelope.get("resume"):
        return
    if "://" in folder:
        try:
            folder = stage_from_uri(folder)
        except Exception as exc:  # noqa: BLE001 - no fsspec, no credentials: the task starts afresh, and says why
            why = redact(f"{folder} ({type(exc).__name__}: {exc})")  # an error may repeat the URI's keys
            say(f"{PREFIX} resume: cannot read {why}; fsspec and the store's credentials must be in the task's "
                "environment. Starting afresh")  # fmt: skip
            return
    found = newest_checkpoint(folder)
    if found is None:
        say(f"{PREFIX} resume: no checkpoint in {redact(folder)} yet, so the task starts afresh")
        return
    os.environ[RESUME_FROM_ENV] = found.path
    if found.number is not None:
        os.environ[RESUME_STEP_ENV] = str(found.number)
    how = LOAD_WITH[found.kind if found.kind != ACCELERATE else envelope["mode"].replace("command", "script")]
    what = "; ".join(filter(None, (found.counted, f"{WHAT[found.kind]}, in {RESUME_FROM_ENV}")))
    say(f"{PREFIX} resume: from {found.path} ({what}): {how}")


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
    found, subfolders = [], {}
    for sub in ("", "checkpoints"):
        try:
            entries = fs.ls(f"{root.rstrip('/')}/{sub}".rstrip("/"), detail=True)
        except (FileNotFoundError, NotADirectoryError):
            continue
        for entry in entries:
            remote = entry["name"].rstrip("/")
            name = remote.rsplit("/", 1)[-1]
            if entry["type"] == "directory":
                kind = checkpoint_kind(name, lambda file, r=remote: fs.exists(f"{r}/{file}"))
                last = f"{remote}/{CHECKPOINT_MARKER if kind == ACCELERATE else TRAINER_MARKER}"
            else:
                kind, last = file_kind(name, functools.partial(fs.open, remote, "rb")), remote
            if kind is not None:
                found.append((remote, kind, _written(fs.info(last))))
                subfolders[remote] = sub
    chosen = newest(found)
    if chosen is not None:
        local = os.path.join(stage, subfolders[chosen.path], os.path.basename(chosen.path))
        if chosen.kind in FILE_KINDS.values():
            os.makedirs(os.path.dirname(local), exist_ok=True)
            fs.get(chosen.path, local)
        else:
            fs.get(f"{chosen.path}/", f"{local}/", recursive=True)
        say(f"{PREFIX} resume: downloaded {redact(uri.rstrip('/'))}/{os.path.relpath(local, stage)}")
    os.environ[CHECKPOINT_ENV], os.environ[CHECKPOINT_URI_ENV] = stage, uri
    say(f"{PREFIX} checkpoint folder staged locally ({CHECKPOINT_ENV}): {stage}")
    return stage


def _written(info: dict[str, Any]) -> float:
    """When a store's object was written, as fsspec's file systems report it (0 where none says)."""
    import datetime

    for key in ("mtime", "LastModified", "last_modified", "updated", "created"):
        value = info.get(key)
        if isinstance(value, str):
            try:
                value = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
            except ValueError:
                continue
        if isinstance(value, datetime.datetime):
            return value.timestamp()
        if isinstance(value, (int, float)):
            return float(value)
    return 0.0


def upload_saves() -> None:
    """With a staged URI folder: after each ``Accelerator.save_state`` into it, the saved folder is uploaded.

    Every process waits for the others to finish saving; one process per machine uploads (the ranks' files of a
    machine lie on its disk). Called by the runtime before a function runs and by :func:`~.resuming.resume` in a
    script; once per process.
    """
    uri, stage = os.environ.get(CHECKPOINT_URI_ENV), os.environ.get(CHECKPOINT_ENV)
    if not uri or not stage:
        return
    try:
        import fsspec
        from accelerate import Accelerator
    except Exception as exc:  # noqa: BLE001 - the function reports its own import errors
        why = redact(f"{uri}: {type(exc).__name__}: {exc}")
        say(f"{PREFIX} checkpoints stay in {stage}, not uploaded to {why}")
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
            say(f"{PREFIX} uploaded {relative} to {redact(uri)}")
        self.wait_for_everyone()
        return saved

    save_state.uploads = True  # type: ignore[attr-defined]
    Accelerator.save_state = save_state

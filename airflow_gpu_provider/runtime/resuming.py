"""``resume(accelerator)``: load the newest checkpoint, with what ``load_state`` leaves out, so a resume is exact.

One helper for both forms of an Accelerate task. A function (``resume=True``) gets it called by the runtime right
after its first ``accelerator.prepare(...)`` (:func:`resume_after_prepare`); a script launched by
``AccelerateOperator(script=...)`` calls it itself, after its own ``prepare``, on every try::

    from airflow_gpu_runtime import resume  # the runtime's archive is on the script's PYTHONPATH

    start_epoch = resume(accelerator).start  # 0 on a fresh start; 3 after checkpoint_2

Accelerate's ``load_state`` restores the models, optimizers, schedulers, GradScaler, ``accelerator.step``, the
objects registered for checkpointing and the global random states (python, numpy, torch, CUDA). It leaves out
what a shuffled ``DataLoader`` depends on, so a resumed training would see other batches than an uninterrupted
one: each prepared dataloader's pass count (``iteration``: the epoch its sampler and dataset are set to) and the
``torch.Generator`` that shuffles it (the one Accelerate gives a ``RandomSampler`` when several processes run, or
one passed to the ``DataLoader``). Here a save-state hook writes both into every ``save_state`` folder
(:data:`DATALOADERS_FILE`, before ``random_states_0.pkl``, the file that marks a save complete) and ``resume``
puts them back. With ``automatic_checkpoint_naming`` the next save is ``checkpoint_<N+1>``, not a clash with
``checkpoint_0``. Imports nothing but the standard library until it is called.
"""

from __future__ import annotations

import json
import os
from typing import Any, NamedTuple

from .checkpoint import CHECKPOINT_MARKER, checkpoint_kind, newest_checkpoint, upload_saves
from .output import say
from .protocol import CHECKPOINT_ENV, PREFIX, RESUME_FROM_ENV, RESUME_STEP_ENV

DATALOADERS_FILE = "airflow_gpu_dataloaders_{}.json"  # one per process, in each save_state folder
TRACKED = "_airflow_gpu_resume"  # set on an accelerator whose saves hold the dataloaders' state


class Resumed(NamedTuple):
    """What :func:`resume` loaded: the checkpoint's folder and the number in its name (``None``, ``None``: none)."""

    path: str | None
    number: int | None

    @property
    def start(self) -> int:
        """The number after the loaded checkpoint's, 0 on a fresh start: the epoch to start at.

        For a loop that saves once per epoch: ``checkpoint_2`` (or ``epoch_2``) was saved after epoch 2.
        """
        return 0 if self.number is None else self.number + 1


def resume(accelerator: Any) -> Resumed:
    """Load the checkpoint the runtime found (``AIRFLOW_GPU_RESUME_FROM``) into ``accelerator``, exactly.

    Call it after ``accelerator.prepare(...)`` (with everything: objects prepared later are not restored) and after
    ``register_for_checkpointing``, on every try: a first try loads nothing, but from then on its saves hold the
    dataloaders' state. Restores what ``load_state`` does and each dataloader's pass count and shuffling
    generator; with ``automatic_checkpoint_naming`` sets the next checkpoint's number (and removes numbered folders
    above the loaded one that a kill cut off while they were being saved).
    """
    _track_dataloaders(accelerator)
    path = os.environ.get(RESUME_FROM_ENV)
    if not path or not os.path.isfile(os.path.join(path, CHECKPOINT_MARKER)):
        _note_unused_checkpoint(path)
        return Resumed(None, None)  # nothing, or a Trainer checkpoint: the runtime's log says how to pass it on
    step = os.environ.get(RESUME_STEP_ENV)
    number = int(step) if step and step.isdigit() else None
    accelerator.load_state(path)
    restored = _restore_dataloaders(accelerator, path)
    config = accelerator.project_configuration
    if config.automatic_checkpoint_naming and number is not None:
        config.iteration = number + 1
        _drop_cut_off_saves(accelerator, number)
    naming = f"; the next save is checkpoint_{config.iteration}" if config.automatic_checkpoint_naming else ""
    say(f"{PREFIX} rank {accelerator.process_index}: resumed from {path} ({restored}{naming})")
    return Resumed(path, number)


def _note_unused_checkpoint(path: str | None) -> None:
    """Say so when a checkpoint lies in the task's folder but the try does not resume (the task has no resume)."""
    folder = os.environ.get(CHECKPOINT_ENV, "")
    found = newest_checkpoint(folder) if path is None and folder and "://" not in folder else None
    if found is not None:
        say(
            f"{PREFIX} resume: {found.path} is there, but the task was not started with resume=True, so nothing "
            "is loaded and the training starts afresh"
        )


def _track_dataloaders(accelerator: Any) -> None:
    """Make every ``save_state`` of ``accelerator`` write the dataloaders' state (once per accelerator)."""
    if getattr(accelerator, TRACKED, False):
        return
    setattr(accelerator, TRACKED, True)
    accelerator.register_save_state_pre_hook(lambda models, weights, folder: _save_dataloaders(accelerator, folder))
    upload_saves()  # a staged URI folder: each save goes back to the store (a script's process too)


def _generators(dataloader: Any) -> list[Any]:
    """The generators that shuffle a prepared dataloader: Accelerate's synchronized one, its sampler's, its own."""
    sampler = getattr(getattr(dataloader, "batch_sampler", None), "sampler", None)
    if sampler is None:
        sampler = getattr(dataloader, "sampler", None)
    return [getattr(x, name, None) for x, name in ((dataloader, "synchronized_generator"), (sampler, "generator"),
                                                   (dataloader, "generator"))]  # fmt: skip


def _save_dataloaders(accelerator: Any, folder: str) -> None:
    """Write this process's dataloaders' pass counts and generator states into a ``save_state`` folder."""
    import base64

    state = {
        "version": 1,
        # saved in the middle of a pass: the rest of that pass cannot be replayed exactly
        "mid_pass": bool(accelerator.gradient_state.in_dataloader),
        "dataloaders": [
            {
                "iteration": getattr(loader, "iteration", None),
                "generators": [
                    None if g is None else base64.b64encode(bytes(g.get_state().tolist())).decode()
                    for g in _generators(loader)
                ],
            }
            for loader in accelerator._dataloaders
        ],
    }
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, DATALOADERS_FILE.format(accelerator.process_index))
    with open(f"{path}.tmp", "w", encoding="utf-8") as handle:
        json.dump(state, handle)
    os.replace(f"{path}.tmp", path)


def _restore_dataloaders(accelerator: Any, folder: str) -> str:
    """Put the dataloaders' pass counts and generators back; say what was restored, in words for the log."""
    import base64

    import torch

    path = os.path.join(folder, DATALOADERS_FILE.format(accelerator.process_index))
    if not os.path.isfile(path):
        return "no dataloader state in it, so shuffled dataloaders may not resume exactly"
    with open(path, encoding="utf-8") as handle:
        state = json.load(handle)
    loaders = accelerator._dataloaders
    for loader, saved in zip(loaders, state["dataloaders"], strict=False):
        if saved["iteration"] is not None and hasattr(loader, "iteration"):
            loader.iteration = saved["iteration"]
        for generator, raw in zip(_generators(loader), saved["generators"], strict=True):
            if generator is not None and raw is not None:
                generator.set_state(torch.tensor(list(base64.b64decode(raw)), dtype=torch.uint8))
    words = f"{min(len(loaders), len(state['dataloaders']))} dataloader(s) at their saved pass and shuffling state"
    if len(loaders) != len(state["dataloaders"]):
        words += f" ({len(state['dataloaders'])} were saved, {len(loaders)} prepared before the resume)"
    if state.get("mid_pass"):
        words += (
            "; saved in the middle of a pass over a dataloader, so the rest of that pass does not replay exactly "
            "(save at the end of a pass for an exact resume)"
        )
    return words


def _drop_cut_off_saves(accelerator: Any, number: int) -> None:
    """Remove ``checkpoints/checkpoint_<M>`` folders, M > ``number``, that a kill cut off while being saved.

    ``save_state`` refuses to write into an existing folder, so one cut off would stop the next save.
    """
    import re
    import shutil

    folder = os.path.join(accelerator.project_dir or "", "checkpoints")
    if accelerator.is_local_main_process and os.path.isdir(folder):
        for name in sorted(os.listdir(folder)):
            match = re.fullmatch(r"checkpoint_([0-9]+)", name)
            path = os.path.join(folder, name)
            cut_off = checkpoint_kind(name, lambda file, path=path: os.path.isfile(os.path.join(path, file))) is None
            if match and int(match.group(1)) > number and cut_off:
                shutil.rmtree(path, ignore_errors=True)
                say(f"{PREFIX} resume: removed {path}, cut off while it was being saved")
    accelerator.wait_for_everyone()


def resume_after_prepare() -> None:
    """Make the first ``Accelerator.prepare`` of this process call :func:`resume` before returning.

    So the function's loop starts from the restored model, optimizer, scheduler, dataloaders and RNG states, and
    every ``save_state`` of the try holds what an exact resume needs (:func:`resume`). On every try: a first try
    finds no checkpoint, but its saves must be complete for the next.
    """
    try:
        from accelerate import Accelerator
    except Exception:  # noqa: BLE001 - no accelerate in the task's environment: nothing of it to resume
        path = os.environ.get(RESUME_FROM_ENV)
        if path:
            say(f"{PREFIX} resume: accelerate cannot be imported here; {path} is left to the function")
        return
    import functools

    original = Accelerator.prepare

    @functools.wraps(original)
    def prepare(self: Any, *args: Any, **kwargs: Any) -> Any:
        prepared = original(self, *args, **kwargs)
        if Accelerator.prepare is prepare:  # the first call only
            Accelerator.prepare = original
            resume(self)
        return prepared

    Accelerator.prepare = prepare

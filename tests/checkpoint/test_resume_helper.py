"""What a resume finds and says, and the one helper, ``airflow_gpu_runtime.resume``, run from the shipped archive."""

from __future__ import annotations

import json
import os
import sys
import textwrap

import pytest
from airflow.sdk import DAG
from shipped_runtime import run_runtime, shipped

from airflow_gpu_provider import GpuStepOperator, gpu_task
from airflow_gpu_provider.exceptions import InvalidSettingError


def _folder(path, *files: str) -> None:
    path.mkdir(parents=True)
    for name in files:
        (path / name).write_text("x")


def test_the_lookup_tells_save_state_folders_from_trainer_checkpoints_and_skips_cut_off_ones(tmp_path):
    checkpoint = shipped("checkpoint")
    accelerate, trainer = tmp_path / "accelerate", tmp_path / "trainer"
    _folder(accelerate / "checkpoints" / "checkpoint_0", "model.safetensors", "random_states_0.pkl")
    _folder(accelerate / "checkpoints" / "checkpoint_1", "model.safetensors", "random_states_0.pkl")
    _folder(accelerate / "checkpoints" / "checkpoint_2", "model.safetensors")  # cut off while being saved
    _folder(trainer / "checkpoint-5", "model.safetensors", "trainer_state.json")
    _folder(trainer / "checkpoint-10", "model.safetensors", "trainer_state.json")
    _folder(trainer / "checkpoint-15", "model.safetensors", "optimizer.pt")  # cut off: no trainer_state.json yet
    _folder(trainer / "runs-99", "trainer_state.json")  # not a Trainer checkpoint's name
    found = checkpoint.newest_checkpoint(str(accelerate))
    assert found == (str(accelerate / "checkpoints" / "checkpoint_1"), 1, "accelerate")
    assert checkpoint.newest_checkpoint(str(trainer)) == (str(trainer / "checkpoint-10"), 10, "trainer")
    assert checkpoint.newest_checkpoint(str(tmp_path / "empty")) is None


def _written(path, files: tuple[str, ...] = ("model.safetensors", "random_states_0.pkl"), *, at: float) -> None:
    """A save_state folder (or, for a name with a suffix, a torch.save file: a zip archive), written at ``at``."""
    import zipfile

    if path.suffix:
        with zipfile.ZipFile(path, "w") as archive:
            archive.writestr("archive/data.pkl", b"weights")
        os.utime(path, (at, at))
        return
    _folder(path, *files)
    for name in files:
        os.utime(path / name, (at, at))


def test_the_newest_is_the_last_written_when_names_count_different_things(tmp_path):
    """accelerate's complete_cv_example saving both: ``step_{n}`` every 3 steps and ``epoch_{n}`` after each epoch;
    Lightning's ``epoch=E-step=S.ckpt`` and ``last.ckpt``; a plain ``torch.save`` file."""
    checkpoint = shipped("checkpoint")
    two_counters = tmp_path / "two_counters"
    for at, name in enumerate(("step_3", "epoch_0", "step_6", "epoch_1"), start=1_000):  # in the order written
        _written(two_counters / name, at=at)
    found = checkpoint.newest_checkpoint(str(two_counters))
    assert (found, found.counted) == ((str(two_counters / "epoch_1"), 1, "accelerate"), "epoch 1")
    _written(two_counters / "step_9", at=2_000)
    assert checkpoint.newest_checkpoint(str(two_counters)).counted == "step 9"

    one_counter = tmp_path / "one_counter"  # copied: the times say nothing, the numbers do
    for name in ("checkpoint_2", "checkpoint_10", "checkpoint_9"):
        _written(one_counter / "checkpoints" / name, at=1_000)
    assert checkpoint.newest_checkpoint(str(one_counter)).path == str(one_counter / "checkpoints" / "checkpoint_10")

    lightning = tmp_path / "lightning"
    lightning.mkdir()
    _written(lightning / "epoch=0-step=8.ckpt", at=1_000)
    _written(lightning / "epoch=1-step=16.ckpt", at=1_001)
    assert checkpoint.newest_checkpoint(str(lightning)) == (str(lightning / "epoch=1-step=16.ckpt"), 1, "lightning")
    _written(lightning / "last.ckpt", at=1_002)  # saved after the top-k checkpoint of the same epoch
    (lightning / "epoch=2-step=24.ckpt").write_bytes(b"PK\x03\x04 cut off")  # no zip directory: cut off
    assert checkpoint.newest_checkpoint(str(lightning)) == (str(lightning / "last.ckpt"), None, "lightning")

    plain = tmp_path / "plain"
    plain.mkdir()
    _written(plain / "weights.pt", at=1_000)
    (plain / "notes.txt").write_text("not a checkpoint")
    assert checkpoint.newest_checkpoint(str(plain)) == (str(plain / "weights.pt"), None, "torch")


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("last.ckpt", "(a Lightning checkpoint, in AIRFLOW_GPU_RESUME_FROM): pass it on: "
         "trainer.fit(model, ckpt_path=os.environ.get('AIRFLOW_GPU_RESUME_FROM'))"),
        ("model.pt", "(a torch.save file, in AIRFLOW_GPU_RESUME_FROM): the task loads it: torch.load("),
        ("epoch_4", "(epoch 4; an accelerator.save_state checkpoint, in AIRFLOW_GPU_RESUME_FROM): loaded after"),
    ],
)  # fmt: skip
def test_lightning_and_torch_files_and_epoch_folders_are_exported_and_named(tmp_path, monkeypatch, capsys, name, says):
    checkpoint = shipped("checkpoint")
    _written(tmp_path / name, at=1_000)
    monkeypatch.setenv("AIRFLOW_GPU_CHECKPOINT_DIR", str(tmp_path))
    checkpoint.prepare_checkpoint({"mode": "callable", "resume": True})
    assert f"resume: from {tmp_path / name} {says}" in capsys.readouterr().out
    assert os.environ["AIRFLOW_GPU_RESUME_FROM"] == str(tmp_path / name)


@pytest.mark.parametrize(
    ("mode", "kind", "says"),
    [
        ("callable", "accelerate", "loaded after the function's first accelerator.prepare()"),
        ("command", "accelerate", "the script loads it: airflow_gpu_runtime.resume(accelerator)"),
        ("callable", "trainer", "pass it on: trainer.train(resume_from_checkpoint=os.environ.get("),
        ("command", "trainer", "pass it on: trainer.train(resume_from_checkpoint=os.environ.get("),
    ],
)
def test_the_log_says_who_loads_the_checkpoint(tmp_path, monkeypatch, capsys, mode, kind, says):
    checkpoint = shipped("checkpoint")
    name, marker = (
        ("checkpoint_3", "random_states_0.pkl") if kind == "accelerate" else ("checkpoint-3", "trainer_state.json")
    )
    _folder(tmp_path / "checkpoints" / name, marker)
    monkeypatch.setenv("AIRFLOW_GPU_CHECKPOINT_DIR", str(tmp_path))
    checkpoint.prepare_checkpoint({"mode": mode, "resume": True})
    out = capsys.readouterr().out
    assert f"resume: from {tmp_path}/checkpoints/{name} (step 3; " in out and says in out
    assert "afresh" not in out
    assert os.environ["AIRFLOW_GPU_RESUME_FROM"] == str(tmp_path / "checkpoints" / name)
    assert os.environ["AIRFLOW_GPU_RESUME_STEP"] == "3"


def test_a_fresh_start_exports_nothing_and_says_so(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("AIRFLOW_GPU_CHECKPOINT_DIR", str(tmp_path))
    monkeypatch.setenv("AIRFLOW_GPU_RESUME_FROM", "/left/over/by/another/try")
    shipped("checkpoint").prepare_checkpoint({"mode": "callable", "resume": True})
    assert f"resume: no checkpoint in {tmp_path} yet, so the task starts afresh" in capsys.readouterr().out
    assert "AIRFLOW_GPU_RESUME_FROM" not in os.environ  # unset: trainer.train(resume_from_checkpoint=None)


SCRIPT = textwrap.dedent(
    """
    import hashlib, json, os, sys

    from airflow_gpu_runtime import resume  # from the runtime's archive, which the runtime put on PYTHONPATH

    assert "torch" not in sys.modules, "importing the helper must not import torch"
    import torch
    from accelerate import Accelerator
    from accelerate.utils import ProjectConfiguration, set_seed

    epochs, kill_at, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    folder = os.environ["AIRFLOW_GPU_CHECKPOINT_DIR"]
    accelerator = Accelerator(cpu=True, project_config=ProjectConfiguration(project_dir=folder,
                                                                            automatic_checkpoint_naming=True))
    set_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(3))
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.1), torch.nn.Linear(8, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=1e-2, total_steps=epochs * len(loader))
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    resumed = resume(accelerator)
    saved = []
    for epoch in range(resumed.start, epochs):
        if epoch == kill_at:
            # killed while saving the next checkpoint: a folder without random_states_0.pkl
            os.makedirs(os.path.join(folder, "checkpoints", f"checkpoint_{epoch}"))
            os._exit(9)
        for x, y in loader:
            accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
            optimizer.step(); scheduler.step(); optimizer.zero_grad()
        saved.append(os.path.basename(accelerator.save_state()))
    state = accelerator.unwrap_model(model).state_dict()
    digest = hashlib.sha256(b"".join(state[k].contiguous().numpy().tobytes() for k in sorted(state))).hexdigest()
    with open(out, "w") as handle:
        json.dump({"resumed": list(resumed), "start": resumed.start, "saved": saved, "sha256": digest}, handle)
    """
)


def _run_script(tmp_path, folder, *args: str):
    from airflow_gpu_provider.task.envelope import Envelope

    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    envelope = Envelope.run([sys.executable, str(script), *args]).to_json(summary={}, resume=True)
    path = tmp_path / "envelope.json"
    path.write_text(json.dumps(envelope))
    environment = {**os.environ, "AIRFLOW_GPU_CHECKPOINT_DIR": str(folder), "CUDA_VISIBLE_DEVICES": ""}
    environment.pop("PYTHONPATH", None)  # the runtime alone makes airflow_gpu_runtime importable
    return run_runtime(str(path), str(tmp_path / "result.json"), env=environment, timeout=300)


def test_the_script_helper_resumes_and_automatic_naming_saves_on_after_a_cut_off_save(tmp_path):
    folder, reference = tmp_path / "ckpt", tmp_path / "reference"
    killed = _run_script(tmp_path, folder, "4", "2", str(tmp_path / "killed.json"))
    assert killed.returncode == 9, killed.stdout + killed.stderr
    assert sorted(os.listdir(folder / "checkpoints")) == ["checkpoint_0", "checkpoint_1", "checkpoint_2"]

    done = _run_script(tmp_path, folder, "4", "-1", str(tmp_path / "resumed.json"))
    assert done.returncode == 0, done.stdout + done.stderr
    resumed = json.loads((tmp_path / "resumed.json").read_text())
    assert resumed["resumed"] == [str(folder / "checkpoints" / "checkpoint_1"), 1] and resumed["start"] == 2
    assert resumed["saved"] == ["checkpoint_2", "checkpoint_3"]  # two saves after the resume, no clash
    assert f"resume: removed {folder}/checkpoints/checkpoint_2, cut off while it was being saved" in done.stdout
    assert "the script loads it: airflow_gpu_runtime.resume(accelerator)" in done.stdout
    assert "rank 0: resumed from " in done.stdout and "the next save is checkpoint_2" in done.stdout

    fresh = _run_script(tmp_path, reference, "4", "-1", str(tmp_path / "reference.json"))
    assert fresh.returncode == 0, fresh.stdout + fresh.stderr
    uninterrupted = json.loads((tmp_path / "reference.json").read_text())
    assert uninterrupted["resumed"] == [None, None] and uninterrupted["start"] == 0
    assert resumed["sha256"] == uninterrupted["sha256"]  # a generator passed to the DataLoader is restored too


def test_the_helper_says_when_a_checkpoint_is_there_but_the_task_does_not_resume(tmp_path, monkeypatch, capsys):
    resuming = shipped("resuming")
    _folder(tmp_path / "checkpoints" / "checkpoint_0", "random_states_0.pkl")
    monkeypatch.setenv("AIRFLOW_GPU_CHECKPOINT_DIR", str(tmp_path))
    monkeypatch.delenv("AIRFLOW_GPU_RESUME_FROM", raising=False)
    resuming._note_unused_checkpoint(None)
    assert "is there, but the task was not started with resume=True" in capsys.readouterr().out


def f() -> None:
    return None


@pytest.mark.parametrize(
    ("kwargs", "why"),
    [
        ({"resume": "yes"}, "expected a boolean"),
        ({"resume": True, "checkpoint": False}, "a task without a checkpoint folder has nothing to resume"),
    ],
)
def test_resume_is_checked_at_parse_on_every_gpu_task(kwargs, why):
    with pytest.raises(InvalidSettingError, match=why):
        GpuStepOperator(task_id="t", python_callable=f, **kwargs)
    with DAG("resume_parse", schedule=None), pytest.raises(InvalidSettingError, match=why):
        gpu_task(task_id="t", **kwargs)(f)()  # @task.gpu(resume=...) in a DAG file


def test_resume_reaches_the_envelope_of_a_plain_task():
    assert GpuStepOperator(task_id="t", python_callable=f, resume=True).resume
    assert not GpuStepOperator(task_id="u", python_callable=f).resume

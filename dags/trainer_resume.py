"""A Hugging Face ``Trainer`` that resumes on its retry: one line of resume code (docs/resilience.md, "Trainer").

A tiny GPT-2 built from a config (random weights: nothing is downloaded from a hub) learns a synthetic token
sequence. ``transformers`` comes from the task's ``ImageSettings`` requirements. The Trainer writes its
``checkpoint-<step>`` folders into the task's checkpoint folder; with ``resume=True`` the provider finds the newest
on a retry and exports it as ``AIRFLOW_GPU_RESUME_FROM`` (unset on a fresh start), which goes straight into
``trainer.train(resume_from_checkpoint=...)``.
"""

from __future__ import annotations

import datetime

from airflow.sdk import Param, dag, task

from airflow_gpu_provider import ImageSettings, gpu_task
from airflow_gpu_provider.params import gpu_params

TRANSFORMERS = "transformers==5.23.0"

DOC = f"""
### Trainer: checkpoint and resume

`train` runs a Hugging Face `Trainer` in `@task.gpu(resume=True, retries=1)`, with `{TRANSFORMERS}` installed from
the task's `ImageSettings` (local backend: a cached virtualenv holding only what the worker lacks). The model is a
one-layer GPT-2 built from a `GPT2Config` with random weights, trained on synthetic token sequences: nothing is
downloaded from a hub.

`TrainingArguments(output_dir=os.environ["AIRFLOW_GPU_CHECKPOINT_DIR"], save_steps=...)` writes `checkpoint-<step>`
folders into the task's checkpoint folder, which every try of the task sees. On a retry the provider finds the
newest complete one and exports it as `AIRFLOW_GPU_RESUME_FROM`; on a fresh start the variable is unset. So the
one line of resume code is `trainer.train(resume_from_checkpoint=os.environ.get("AIRFLOW_GPU_RESUME_FROM"))`.

Set **fail_at_step** to a step that saves a checkpoint (a multiple of **save_steps**) to kill try 1 right after
that save, as a preempted node would end it. Try 2's log then shows `[gpu] resume: from .../checkpoint-<step>`,
and its XCom `started_at_step`. The final weights are the same as those of an uninterrupted run. See
docs/resilience.md.
"""


@dag(
    dag_id="trainer_resume",
    schedule=None,
    catchup=False,
    tags=["gpu", "example", "transformers", "resilience"],
    doc_md=DOC,
    params={
        "epochs": Param(2, type="integer", minimum=1, maximum=50, description="Passes over the training set."),
        "batch_size": Param(4, type="integer", minimum=1, description="Sequences per training step."),
        "save_steps": Param(5, type="integer", minimum=1, description="Steps between two checkpoints."),
        "fail_at_step": Param(
            -1, type="integer", minimum=-1, description="Try 1 is killed right after saving this step (-1: never)."
        ),
        **gpu_params(gpu_count=1, max_gpus=1),
    },
)
def trainer_resume() -> None:
    """Train with a Trainer -> report."""

    @gpu_task(
        image=ImageSettings(requirements=[TRANSFORMERS]),
        cpu_count=2,
        gpu_count="{{ params.gpu_count }}",
        backend="{{ params.backend }}",
        on_missing_gpu="{{ params.on_missing_gpu }}",
        resume=True,
        retries=1,
        retry_delay=datetime.timedelta(seconds=0),
    )
    def train(params: dict | None = None) -> dict:
        import hashlib
        import os

        import torch
        import transformers
        from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

        params = params or {}
        fail_at = int(params.get("fail_at_step", -1))
        resume_from = os.environ.get("AIRFLOW_GPU_RESUME_FROM")  # the newest checkpoint-N; unset on a fresh start

        class KillAfterSave(TrainerCallback):
            def on_save(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
                if state.global_step == fail_at and resume_from is None:
                    print(f"killed on purpose after saving step {fail_at} (fail_at_step)", flush=True)
                    os._exit(1)  # no cleanup, as a preempted node ends a training

        transformers.set_seed(0)
        start = torch.randint(0, 64, (48, 1), generator=torch.Generator().manual_seed(1))
        sequences = (start + 3 * torch.arange(16)) % 64  # a pattern to learn: steps of 3, modulo the vocabulary
        dataset = [{"input_ids": row, "labels": row} for row in sequences]
        model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=1, n_head=2))
        mixed = params.get("mixed_precision", "no")
        args = TrainingArguments(
            output_dir=os.environ["AIRFLOW_GPU_CHECKPOINT_DIR"],
            num_train_epochs=int(params.get("epochs", 2)),
            per_device_train_batch_size=int(params.get("batch_size", 4)),
            learning_rate=1e-3,
            warmup_steps=3,
            save_strategy="steps",
            save_steps=int(params.get("save_steps", 5)),
            logging_steps=5,
            seed=0,
            fp16=mixed == "fp16",
            bf16=mixed == "bf16",
            report_to=[],
            disable_tqdm=True,
        )
        trainer = Trainer(model=model, args=args, train_dataset=dataset, callbacks=[KillAfterSave()])
        result = trainer.train(resume_from_checkpoint=resume_from)  # the one line of resume code
        state = model.state_dict()
        digest = hashlib.sha256(b"".join(state[k].detach().cpu().contiguous().numpy().tobytes() for k in sorted(state)))
        return {
            "started_at_step": int(os.environ.get("AIRFLOW_GPU_RESUME_STEP", "0")),
            "global_step": trainer.state.global_step,
            "train_loss": result.training_loss,
            "weights_sha256": digest.hexdigest(),
            "transformers": transformers.__version__,
        }

    @task
    def report(metrics: dict) -> dict:
        print(f"trained to step {metrics['global_step']} (from step {metrics['started_at_step']})")
        return metrics

    report(train())


trainer_resume()

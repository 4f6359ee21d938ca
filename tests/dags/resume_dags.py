"""DAGs for tests/checkpoint/test_exact_resume.py: trainings written as people write them, killed on try 1.

Each DAG has the interrupted task (``retries=1``: try 1 is killed with ``os._exit`` in the middle, as a preempted
node would end it, and try 2 resumes) and the same training uninterrupted, with the same seed: the test compares
their final weights byte for byte. Checkpoints go under ``params.root`` (a folder of the test's own).
"""

from __future__ import annotations

import datetime
from pathlib import Path

from airflow.sdk import DAG, Param

from airflow_gpu_provider import AccelerateOperator, gpu_task

START = datetime.datetime(2024, 1, 1)
RETRY = {"retries": 1, "retry_delay": datetime.timedelta(0)}
SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
PARAMS = {"root": Param("/tmp", type="string"), "out": Param("/tmp", type="string")}


def train_text_classifier(epochs: int, kill_at: int) -> dict:
    """In the style of accelerate's complete_nlp_example (tokenizer-free): shuffled train and eval loaders, AdamW
    with weight-decay groups, a linear warmup-and-decay schedule, dropout, gather_for_metrics; save_state after
    each epoch; no resume code."""
    import hashlib
    import os

    import torch
    from accelerate import Accelerator
    from accelerate.utils import ProjectConfiguration, set_seed

    folder = os.environ["AIRFLOW_GPU_CHECKPOINT_DIR"]
    accelerator = Accelerator(project_config=ProjectConfiguration(project_dir=folder, automatic_checkpoint_naming=True))
    set_seed(42)
    tokens = torch.randint(0, 50, (96, 12), generator=torch.Generator().manual_seed(0))
    labels = tokens.sum(1) % 2
    data = torch.utils.data
    train = data.DataLoader(data.TensorDataset(tokens[:64], labels[:64]), batch_size=8, shuffle=True)
    evaluation = data.DataLoader(data.TensorDataset(tokens[64:], labels[64:]), batch_size=8, shuffle=True)
    model = torch.nn.Sequential(
        torch.nn.EmbeddingBag(50, 16, mode="mean"), torch.nn.Dropout(0.1), torch.nn.Linear(16, 2)
    )
    decay = [p for n, p in model.named_parameters() if not n.endswith("bias")]
    no_decay = [p for n, p in model.named_parameters() if n.endswith("bias")]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0}])
    total, warmup = epochs * len(train), 3  # transformers' get_linear_schedule_with_warmup, as a LambdaLR
    schedule = lambda s: s / warmup if s < warmup else max(0.0, (total - s) / (total - warmup))  # noqa: E731
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    model, optimizer, train, evaluation, scheduler = accelerator.prepare(model, optimizer, train, evaluation, scheduler)
    start, accuracy = accelerator.save_iteration, []
    for epoch in range(start, epochs):
        if epoch == kill_at and start == 0:
            accelerator.wait_for_everyone()  # every rank's part of the last save is written (else it resumes earlier)
            print(f"killed at epoch {epoch}", flush=True)
            os._exit(9)  # no cleanup, no result: as a preempted node ends a training
        model.train()
        for batch, target in train:
            loss = torch.nn.functional.cross_entropy(model(batch), target)
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
        model.eval()
        correct = seen = 0
        for batch, target in evaluation:
            with torch.no_grad():
                predictions = model(batch).argmax(-1)
            predictions, references = accelerator.gather_for_metrics((predictions, target))
            correct, seen = correct + int((predictions == references).sum()), seen + len(references)
        accuracy.append(correct / seen)
        accelerator.save_state()
    state = accelerator.unwrap_model(model).state_dict()
    digest = hashlib.sha256(b"".join(state[k].detach().contiguous().numpy().tobytes() for k in sorted(state)))
    return {
        "world_size": accelerator.num_processes,
        "started_at": start,
        "sha256": digest.hexdigest(),
        "weight_sum": sum(float(v.double().sum()) for v in state.values()),
        "accuracy": accuracy,
        "checkpoints": sorted(os.listdir(os.path.join(folder, "checkpoints"))),
    }


with DAG("resume_function", schedule=None, start_date=START, params=PARAMS):
    shuffled = gpu_task(accelerate={"num_processes": 2, "cpu": True, "resume": True}, checkpoint="{{ params.root }}")
    shuffled(train_text_classifier).override(task_id="interrupted", **RETRY)(4, 2)
    shuffled(train_text_classifier).override(task_id="uninterrupted")(4, -1)


def script_task(
    task_id: str, kill_at: int, script: str = "cv_resume_script.py", epochs: int = 5, *args: str, **kwargs: object
) -> AccelerateOperator:
    out = f"{{{{ params.out }}}}/{task_id}.json"
    return AccelerateOperator(
        task_id=task_id,
        script=str(SCRIPTS / script),
        script_args=["--epochs", str(epochs), "--kill-at", str(kill_at), "--out", out, *args],
        num_processes=2,
        cpu=True,
        resume=True,
        checkpoint="{{ params.root }}",
        **kwargs,
    )


with DAG("resume_script", schedule=None, start_date=START, params=PARAMS):
    script_task("interrupted", 2, **RETRY)
    script_task("uninterrupted", -1)


# accelerate's complete_cv_example saving both step_{n} and epoch_{n}: killed right after saving epoch_1 (step 8),
# when step_6 has the higher number but epoch_1 was written last
STEPS_AND_EPOCHS = ("cv_steps_and_epochs_script.py", 3, "--checkpointing-steps", "3")
with DAG("resume_steps_and_epochs", schedule=None, start_date=START, params=PARAMS):
    script_task("interrupted", 1, *STEPS_AND_EPOCHS, **RETRY)
    script_task("uninterrupted", -1, *STEPS_AND_EPOCHS)

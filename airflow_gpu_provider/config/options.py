"""The ``[gpu]`` options: one table, from which the provider info, the defaults and the typed getters come."""

from __future__ import annotations

from typing import Literal, NamedTuple

SECTION = "gpu"


class Option(NamedTuple):
    """One ``[gpu]`` option as the provider-info schema describes it."""

    name: str
    type: Literal["string", "boolean", "integer", "float"]
    default: str
    description: str
    example: str | None = None
    #: its meaning in one line, for docs/configuration.md (``scripts/config_docs.py``)
    short: str = ""


OPTIONS: tuple[Option, ...] = (
    Option(
        "backend",
        "string",
        "local",
        "Backend for GPU tasks that don't name one: local (a child process on the worker), docker, "
        "kubernetes, or executor (Airflow's executor places the task on a GPU worker, pod or queue, where it runs "
        "like local). Moving a DAG between them needs only this option.",
        "docker",
        short="backend for tasks that don't name one",
    ),
    Option(
        "on_missing_gpu",
        "string",
        "fail",
        "What a task does when fewer GPUs are present or free than it requested: fail (fail fast, naming "
        "what was requested and what exists), wait (until GPUs are free) or cpu (run on CPU, with a "
        "warning).",
        "wait",
        short="`fail`, `wait` or `cpu`",
    ),
    Option(
        "devices",
        "string",
        "auto",
        "GPU inventory of a worker host for the local backend: auto (ask NVML, from the nvml extra), none, "
        "or a comma-separated list of device ids such as 0,1,2,3, each optionally with its model (0=L4,1=A100-80GB: "
        "a known model gives the device's memory, which OOM escalation compares).",
        "0,1",
        short=("local inventory: `auto` (NVML), `none`, or ids `0,1,2,3`, optionally with models `0=L4,1=A100-80GB`"),
    ),
    Option(
        "extra_accelerators",
        "string",
        "",
        "Accelerator models that tasks may name besides the known ones (KNOWN_MODELS in "
        "airflow_gpu_provider/settings/accelerators.py) and those of [gpu] devices: comma-separated names, as your "
        "nodes, pools and queues call them. Any other name is refused when the DAG is parsed, on every backend (set it "
        "on the DAG processor as on the workers).",
        "RTX-5090, L20",
        short=(
            "accelerator models tasks may name besides the known ones and those of `devices`; any other is "
            "refused at parse"
        ),
    ),
    Option(
        "state_dir",
        "string",
        "",
        "Host-wide directory shared by every worker of one user on a host: one lock file per GPU, the cached "
        "virtualenvs of injected requirements, the tasks' private folders, build locks and Accelerate's option "
        "cache. Created 0700 when missing; refused when another user owns it or may write to it. Empty: "
        ".local/state/airflow-gpu-provider in the home folder of the worker's user (its passwd entry, not $HOME), "
        "where no other local user can make it first; on a home that hosts share (NFS), set a folder local to each "
        "host.",
        "/srv/airflow-gpu",
        short=(
            "host-wide GPU locks, venv cache, task folders and build locks (empty: "
            "`~/.local/state/airflow-gpu-provider` of the worker's user; "
            "[local.md](local.md#the-state-dir-gpu-state_dir))"
        ),
    ),
    Option(
        "cache_size",
        "string",
        "50Gi",
        "Disk that each cache of a worker host may take: the local backend's virtualenvs of injected requirements "
        "(in the state dir) and the derived images of a Docker engine on the host (their own layers). Beyond it, "
        "the least recently used ones are removed when another is built, never one a task uses, each named in the "
        "log. 0: no limit.",
        "200Gi",
        short=(
            "disk each host cache may take (local venvs; a local engine's derived images), least recently "
            "used first; 0: no limit"
        ),
    ),
    Option(
        "pool",
        "string",
        "",
        "Airflow pool that GPU tasks join, with pool_slots equal to their gpu_count; empty for none. Size it "
        "to the number of GPUs (airflow pools set gpu 4 'GPUs'), or let [gpu] inventory size it. {accelerator} "
        "and {queue} give one pool per worker class (gpu-{accelerator}: gpu-a100, gpu-h100).",
        "gpu",
        short="Airflow pool for GPU tasks; `{accelerator}` / `{queue}`: one per worker class",
    ),
    Option(
        "queue",
        "string",
        "gpu",
        "Queue of GPU tasks on the executor backend under CeleryExecutor or the Edge executor ({accelerator} is "
        "the task's accelerator model in lower case, or any when it names none: gpu-{accelerator} gives gpu-a100). "
        "CPU-only tasks keep their queue.",
        "gpu-{accelerator}",
        short="queue of GPU tasks on the executor backend (Celery, Edge); `gpu-{accelerator}` per model",
    ),
    Option(
        "executor",
        "string",
        "",
        "Executor that GPU tasks of the executor backend go to, set as the task's executor, when [core] executor "
        "names several (e.g. CeleryExecutor,KubernetesExecutor); empty: the default (first) executor.",
        "KubernetesExecutor",
        short="executor of GPU tasks on the executor backend when `[core] executor` names several",
    ),
    Option(
        "inventory",
        "string",
        "",
        "GPUs of each worker class, for the GPU pools the scheduler creates or checks when it starts: "
        "comma-separated MODEL=COUNT (accelerator models, or * for GPU tasks that name none). With "
        "[gpu] pool = gpu-{accelerator} (or {queue}) each model gets its own pool of that size; a pool without a "
        "placeholder gets the total. Empty: pools are left to you.",
        "A100=16, H100=8",
        short="GPUs per worker class (`A100=16, H100=8`): the scheduler creates the GPU pools when it starts",
    ),
    Option(
        "poll_interval",
        "float",
        "0.25",
        "Seconds between two looks of a waiting task: at the GPU locks (on_missing_gpu=wait, in the worker or "
        "deferred), at a deferred task's container or job. On average half of it is added to the task's time. A look "
        "costs about a millisecond of the engine's time (an inspect of the container) or a read of /proc/locks.",
        "1.0",
        short="seconds between two looks of a waiting task (GPU locks, a deferred task's container or job)",
    ),
    Option(
        "wait_timeout",
        "float",
        "86400",
        "Seconds a task with on_missing_gpu=wait waits for GPUs (in the worker, or deferred) before it fails, "
        "naming what it waited for. A task's wait_timeout overrides it.",
        "3600",
        short=('seconds a task with `on_missing_gpu="wait"` waits before it fails (a task\'s `wait_timeout` first)'),
    ),
    Option(
        "clear_cache_between_tasks",
        "boolean",
        "True",
        "Whether the listener clears the CUDA cache of a worker's task process after each task "
        "(a no-op when the task never loaded torch).",
        "False",
        short="listener clears the CUDA cache after each task",
    ),
    Option(
        "checkpoint_root",
        "string",
        "",
        "Where GPU tasks' checkpoint folders are (AIRFLOW_GPU_CHECKPOINT_DIR; one per task and DAG run, the same for "
        "every try): an absolute path, or an object-storage URI (s3://, gs://, abfs://, ...) that a retry on "
        "another host reaches. Empty: <state_dir>/checkpoints, on each worker host. A task's checkpoint= overrides it.",
        "s3://ml-bucket/airflow-checkpoints",
        short=(
            "root of the tasks' checkpoint folders: an absolute path or a URI such as `s3://bucket/ckpt` "
            "(empty: `<state_dir>/checkpoints`; [resilience](resilience.md))"
        ),
    ),
    Option(
        "checkpoint_cleanup",
        "boolean",
        "True",
        "Whether the checkpoint folders of a DAG run are deleted when it succeeds (local roots the deleting host "
        "reaches, and URI roots through fsspec).",
        "False",
        short="delete a DAG run's checkpoint folders when it succeeds",
    ),
    Option(
        "kill_grace",
        "float",
        "30.0",
        "Seconds a stopped GPU task (on_kill, execution_timeout, a pod eviction) gets between SIGTERM and SIGKILL, "
        "to write a last checkpoint: the local process tree, docker stop's timeout, the pod's "
        "terminationGracePeriodSeconds. backend_options kill_grace / stop_timeout / termination_grace_period "
        "override it per task.",
        "120",
        short=(
            "seconds between SIGTERM and SIGKILL for a stopped task (local tree, `docker stop`, the pod's grace period)"
        ),
    ),
    Option(
        "quarantine_seconds",
        "float",
        "3600",
        "Seconds a GPU of a worker host is left out by the local and Docker backends after a try failed on it "
        "because of the GPU itself (an Xid error such as 79, an uncorrectable ECC error). 0: never quarantined.",
        "600",
        short=(
            "seconds a host's GPU is left out by local and Docker tasks after a try failed on it (Xid, ECC); 0: never"
        ),
    ),
    Option(
        "infra_retries",
        "integer",
        "0",
        "Times a try that failed because of the infrastructure (a GPU fault, an NCCL timeout, a pod evicted, "
        "preempted or lost with its node, an image pull) is run again at once without using one of the task's "
        "retries (Airflow's reschedule: the same try number), avoiding the node or GPU that failed.",
        "2",
        short=(
            "times a try failed by the infrastructure (GPU fault, NCCL timeout, pod evicted or lost) runs "
            "again without using `retries`"
        ),
    ),
    Option(
        "profile_interval",
        "float",
        "1.0",
        "Seconds between two samples of the profile of every GPU task while it runs: GPU utilisation, memory, power "
        "and temperature through NVML (or CPU and memory of the task's processes where there is no GPU), summarised "
        "with advice at the end of the log, stored in XCom under gpu_profile and shown in the UI's GPU tab. 0.25 or "
        "more (each sample takes the GPU driver's lock, which the task's own CUDA calls wait for); 0: not profiled.",
        "5.0",
        short=(
            "seconds between samples of every GPU task's profile (log, XCom `gpu_profile`, the UI's GPU tab);"
            " 0.25 or more, 0: off"
        ),
    ),
    Option(
        "prices",
        "string",
        "",
        "Price per device-hour of each accelerator model, for the cost in task profiles (on-prem too: your own "
        "amortised cost): comma-separated MODEL=PRICE; cpu=PRICE prices CPU profiles. Empty: no cost shown.",
        "A100-80GB=3.04, H100=4.10, L4=0.71",
        short="`MODEL=PRICE, ...` per device-hour (`A100-80GB=3.04, cpu=0.05`) for the cost",
    ),
)

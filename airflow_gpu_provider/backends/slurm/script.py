"""The job's batch script: checks the shared folder, installs the requirements once, runs the runtime on each node.

Written into the job's folder on the cluster's shared folder, beside the runtime archive and the envelope
(``job.py``). On its first node it checks that the folder is there (a node that does not mount the shared folder at
the worker's path fails at once, saying so); with requirements it uses their cached folder on the shared folder
(``envs/<digest>``, installed by the first job that needs it with the runtime's installer, then renamed into place:
the next jobs only check it); then it runs ``runtime.pyz reap`` (the pinned subreaper, ``runtime/reaper.py``),
whose exit status it writes to ``exit`` (the job's own record of its end, for a controller that has forgotten the
job and a cluster without accounting). On several nodes one ``srun`` task per node runs it, each with
``NODE_RANK`` (``SLURM_NODEID``), ``NUM_NODES``, ``MASTER_ADDR`` (the first node's address) and ``MASTER_PORT`` (a
port derived from the job id, or the task's): what ``accelerate launch --machine_rank ... --num_machines ...
--main_process_ip ... --main_process_port ...`` takes. Each node writes ``result-<rank>.json``.
"""

from __future__ import annotations

import hashlib
import shlex

from airflow_gpu_provider.backends.slurm.plan import SlurmPlan
from airflow_gpu_provider.runtime.protocol import INSTALL, REAP
from airflow_gpu_provider.task.runtime_zip import FILE_NAME

ENVELOPE = "envelope.json"
RESULT = "result.json"
EXIT = "exit"
SCRIPT = "job.sh"
EXIT_NO_FOLDER = 97  # the node does not see the job's folder
EXIT_NO_INSTALL = 98  # the requirements could not be installed


def requirements_key(plan: SlurmPlan, python: str) -> str:
    """The cached folder's name: the requirements, the installer, the indexes and the nodes' Python."""
    image = plan.request.image
    text = repr((sorted(image.requirements), image.python_package_installer, image.installer_index_args(), python))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _install(plan: SlurmPlan, python: str, envs: str) -> list[str]:
    image = plan.request.image
    if not image.requirements:
        return []
    deps = shlex.quote(f"{envs}/{requirements_key(plan, python)}")
    install = [python, FILE_NAME, INSTALL, "--python", python, "--where", "the nodes' Python"]
    command = " ".join(map(shlex.quote, install)) + ' "$tmp" ' + shlex.quote(image.python_package_installer)
    command += " " + " ".join(map(shlex.quote, [*image.installer_index_args(), "--", *image.requirements]))
    return [
        f"deps={deps}",
        'if [ ! -e "$deps/.complete" ]; then',
        '  tmp="$deps.$SLURM_JOB_ID.$$"',
        f'  {command} || {{ rm -rf "$tmp"; echo "[gpu] error: the requirements could not be installed" >&2; '
        f"exit {EXIT_NO_INSTALL}; }}",
        '  touch "$tmp/.complete" && { mv -T "$tmp" "$deps" 2>/dev/null || rm -rf "$tmp"; }',
        "else",
        '  echo "[gpu] requirements: the cached folder $deps (installed by an earlier job)"',
        "fi",
        'export PYTHONPATH="$deps${PYTHONPATH:+:$PYTHONPATH}"',
    ]


def batch_script(plan: SlurmPlan, folder: str, python: str, envs: str) -> str:
    """The script's text (bash; every value quoted).

    :param folder: the job's folder (on the shared folder)
    :param python: the nodes' Python
    :param envs: the folder of the cached requirements (on the shared folder)
    """
    quoted, py = shlex.quote(folder), shlex.quote(python)
    lines = [
        "#!/bin/bash",
        f"# airflow-gpu-provider: one try of {plan.request.display_name}",
        f"cd {quoted} 2>/dev/null && [ -w . ] || {{ echo \"[gpu] error: node $(hostname) does not see the job's folder "
        f"{folder} (the connection's shared_dir must be mounted at the same path on every node and the worker)\" >&2; "
        f"exit {EXIT_NO_FOLDER}; }}",
        *([] if plan.gpus else ["export CUDA_VISIBLE_DEVICES=  # no GPU: the task sees none (Slurm sets none)"]),
        *_install(plan, python, envs),
    ]
    if plan.num_nodes == 1:
        lines.append(f"{py} {FILE_NAME} {REAP} {ENVELOPE} {RESULT}")
    else:
        port = (
            str(plan.request.rendezvous_port) if plan.request.rendezvous_port else "$((20000 + SLURM_JOB_ID % 20000))"
        )
        rank = (
            f"export NODE_RANK=$SLURM_NODEID NUM_NODES=$SLURM_JOB_NUM_NODES MASTER_ADDR=$SLURM_LAUNCH_NODE_IPADDR "
            f"MASTER_PORT={port}; exec {py} {FILE_NAME} {REAP} {ENVELOPE} result-$SLURM_NODEID.json"
        )
        gres = [f"--gres={plan_gres}" for plan_gres in [_gres_of(plan)] if plan_gres]
        srun = ["srun", f"--nodes={plan.num_nodes}", "--ntasks-per-node=1", "--kill-on-bad-exit=1", *gres]
        lines.append(" ".join(srun) + " bash -c " + shlex.quote(rank))
    lines += ["status=$?", f'echo "$status" > {EXIT}', 'exit "$status"']
    return "\n".join(lines) + "\n"


def _gres_of(plan: SlurmPlan) -> str:
    return f"gpu:{plan.gpus}" if plan.gpus else ""

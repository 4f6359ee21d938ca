"""The class of a failed try, as the runtime sees it: the user's code, its resources, or the infrastructure.

An exception whose text is what ``torch.distributed`` and NCCL (or gloo) print when a collective timed out or its
communicator was aborted is the infrastructure's (``error.kind``, in any rank: :func:`collective_evidence`); so is
any failure of a try during which the sampler saw a GPU fault (the profile's ``gpu_faults``, ``telemetry/nvml.py``):
an Xid error after which the GPU needs more than the application's restart (:func:`is_infrastructure_fault`), or a
rise of its uncorrectable ECC error count. An out-of-memory error is the resources' (``escalation.py``); anything
else the application's. :func:`settle` writes the class into the
result (``failure``); the worker reads it (``task/result.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .output import say
from .protocol import INFRASTRUCTURE, PREFIX, failure_class

# NVIDIA's Xid catalogue (https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html, "Resolution Bucket
# (Immediate Action)"): the Xids whose immediate action is to reset the GPU (RESET_GPU), to restart the machine or VM
# (RESTART_BM, RESTART_VM), or a workflow that ends in one of those (WORKFLOW_XID_48, WORKFLOW_NVLINK_ERR and
# WORKFLOW_NVLINK5_ERR: "a GPU reset or node reboot is needed"), and Xid 154, which reports that the recovery action
# changed. It decides only where the driver does not give the GPU's recovery action (:func:`is_infrastructure_fault`).
XID_INFRASTRUCTURE = {
    46: "GPU stopped processing",
    48: "double-bit ECC error",
    62: "internal micro-controller halt",
    64: "GPU memory remapping failure",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    95: "uncontained memory error",
    109: "context switch timeout",
    110: "security fault",
    119: "GSP RPC timeout",
    120: "GSP error",
    136: "link training failed",
    140: "unrecovered ECC error",
    143: "GPU initialization error",
    **{xid: "NVLink error" for xid in range(144, 151)},
    151: "key rotation error",
    154: "GPU recovery action changed",
    155: "NVLink software-defined error",
    156: "resource retirement event",
}
# Xids the catalogue says the application's restart (RESTART_APP) or nothing (IGNORE) answers: said by name only
XID_CONTAINED = {
    13: "graphics engine exception",
    43: "GPU stopped processing the application's work",
    45: "preemptive cleanup after an earlier error",
    63: "GPU memory row remapped",
    92: "high single-bit ECC error rate",
    94: "contained memory error",
}

# What ProcessGroupNCCL (torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp, NCCLUtils.cpp) and NCCL itself say when a
# collective timed out, a communicator was aborted, or a peer or the network failed; and gloo's collective timeout
# (third_party/gloo/gloo/transport/tcp/unbound_buffer.cc: "Timed out waiting 3000ms for recv operation to complete").
COLLECTIVE_TEXTS = (
    "Watchdog caught collective operation timeout",
    "Some NCCL operations have failed or timed out",
    "NCCL communicator was aborted",
    "NCCL communicator encountered error",
    "ncclRemoteError",
    "ncclSystemError",
    "NCCL timeout",
    "for recv operation to complete",
    "for send operation to complete",
)


def collective_evidence(exc: BaseException | None) -> str | None:
    """The line of ``exc`` (or of an exception it was raised from) that says a collective failed, or ``None``."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        for line in str(exc).splitlines():
            if any(text in line for text in COLLECTIVE_TEXTS):
                return line.strip()[:500]
        exc = exc.__cause__ or exc.__context__
    return None


def describe_fault(fault: Mapping[str, Any]) -> str:
    """One GPU fault in words: ``Xid 79 on GPU 0 (GPU-...): GPU has fallen off the bus``."""
    where = f"GPU {fault.get('index', '?')}" + (f" ({fault['uuid']})" if fault.get("uuid") else "")
    if "xid" not in fault:
        return f"{fault.get('ecc_uncorrected')} uncorrectable ECC error(s) on {where}"
    xid = int(fault["xid"])
    meaning = XID_INFRASTRUCTURE.get(xid) or XID_CONTAINED.get(xid) or "an Xid error"
    action = fault.get("recovery_action")
    return f"Xid {xid} on {where}: {meaning}" + (f" (recovery action: {action})" if action else "")


def is_infrastructure_fault(fault: Mapping[str, Any]) -> bool:
    """Whether a fault the sampler saw says the GPU failed, not the task.

    An uncorrectable ECC error does; an Xid does when the GPU's recovery action (read from the driver when the Xid
    came) is anything but ``"none"``, or, where the driver does not give it, when NVIDIA's catalogue says the GPU
    needs a reset or more (:data:`XID_INFRASTRUCTURE`): Xid 94, a contained error, needs only the application's
    restart.
    """
    if fault.get("ecc_uncorrected"):
        return True
    if "xid" not in fault:
        return False
    action = fault.get("recovery_action")
    return action != "none" if action is not None else int(fault["xid"]) in XID_INFRASTRUCTURE


def settle(result: dict[str, Any], profile: Mapping[str, Any] | None) -> dict[str, Any]:
    """Write the class of a failed ``result`` into it (``failure``), and say so in one line when it is not the user's.

    :param profile: the try's profile (its ``gpu_faults``, ``host`` and ``node``), ``None`` when it was not sampled
    """
    if result.get("ok"):
        return result
    error = result.get("error") or {}
    faults = [f for f in (profile or {}).get("gpu_faults") or [] if is_infrastructure_fault(f)]
    evidence = [describe_fault(fault) for fault in faults]
    if error.get("kind") == INFRASTRUCTURE:
        evidence.append(str(error.get("evidence") or error.get("message", "")))
    klass = INFRASTRUCTURE if faults else failure_class(error.get("kind"))
    if klass == INFRASTRUCTURE:
        reason = "GPU fault" if faults else "collective (NCCL) timeout or abort"
        error_text = error.get("message") or f"exit status {result.get('exit_status')}"
        if faults and error.get("kind") != INFRASTRUCTURE:
            evidence.append(f"then the task failed: {str(error_text).splitlines()[0][:300] if error_text else ''}")
    else:
        reason = {"resources": "out of memory", "application": "the task's code failed"}[klass]
    gpus = {str(f.get("index")): f.get("uuid") for f in faults}
    result["failure"] = {
        "class": klass,
        "reason": reason,
        "evidence": evidence,
        "host": (profile or {}).get("host"),
        "node": (profile or {}).get("node"),
        "gpus": [{"index": index, "uuid": uuid} for index, uuid in gpus.items()],
    }
    if klass == INFRASTRUCTURE:
        say(f"{PREFIX} infrastructure failure ({reason}): {'; '.join(evidence)}", stderr=True)
    return result

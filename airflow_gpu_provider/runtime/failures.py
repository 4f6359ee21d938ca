"""The class of a failed try, as the runtime sees it: the user's code, its resources, or the infrastructure.

An exception whose text is what ``torch.distributed`` and NCCL (or gloo) print when a collective timed out or its
communicator was aborted is the infrastructure's (``error.kind``, in any rank: :func:`collective_evidence`); so is
any failure of a try during which the sampler saw an Xid error of :data:`~.protocol.XID_INFRASTRUCTURE` or a rise of
a GPU's uncorrectable ECC error count (the profile's ``gpu_faults``, ``telemetry/nvml.py``). An out-of-memory error
is the resources' (``escalation.py``); anything else the application's. :func:`settle` writes the class into the
result (``failure``); the worker reads it (``task/result.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .output import say
from .protocol import INFRASTRUCTURE, PREFIX, XID_INFRASTRUCTURE, failure_class

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
    """One GPU fault in words: ``GPU 0 (GPU-...): Xid 79 (GPU has fallen off the bus)``."""
    who = f"GPU {fault.get('index', '?')}" + (f" ({fault['uuid']})" if fault.get("uuid") else "")
    if "xid" in fault:
        meaning = XID_INFRASTRUCTURE.get(int(fault["xid"]), "not a hardware Xid")
        return f"{who}: Xid {fault['xid']} ({meaning})"
    return f"{who}: {fault.get('ecc_uncorrected')} uncorrectable ECC error(s)"


def is_infrastructure_fault(fault: Mapping[str, Any]) -> bool:
    """Whether a fault the sampler saw says the GPU failed (an Xid of the list, an uncorrectable ECC error)."""
    return fault.get("xid") in XID_INFRASTRUCTURE or bool(fault.get("ecc_uncorrected"))


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

"""``on_missing_gpu``: what a task does when the GPUs it asked for are missing or busy, on every backend.

This is the one place that decides it; the allocator, the Docker backend and the Kubernetes backend only ask
:data:`POLICIES`. The same table is in docs/tasks.md.

======  ===================================  ===================================  ===================================
policy  local                                docker                               kubernetes
======  ===================================  ===================================  ===================================
fail    fail at once, naming the request,    as local when the engine is on this  the pod may stay Pending for
        the host's GPUs and who holds the    host and its GPUs are known; an      ``pending_timeout`` (300 s), then
        busy ones                            engine without the NVIDIA runtime    the task fails with the scheduler's
                                             fails naming the toolkit             reason
wait    poll the GPU locks every             as local; an engine without the      Pending for up to
        ``[gpu] poll_interval`` until        NVIDIA runtime fails (waiting        ``pending_timeout`` (24 h)
        free; fail at once when the host     cannot help)
        has too few
cpu     run on the CPU now, with a warning   run a CPU-only container, with a     after ``pending_timeout`` (300 s),
                                             warning                              run a CPU-only pod (single node)
======  ===================================  ===================================  ===================================
"""

from __future__ import annotations

from typing import Literal, NamedTuple

OnMissingGpu = Literal["fail", "wait", "cpu"]


class MissingGpuPolicy(NamedTuple):
    """One ``on_missing_gpu`` value and what it means.

    :param waits: keep trying until busy GPUs are free
    :param runs_on_cpu: run without the GPUs instead of failing
    :param pending_timeout: seconds a Kubernetes GPU pod may stay unscheduled (``backend_options`` may override)
    """

    name: OnMissingGpu
    waits: bool
    runs_on_cpu: bool
    pending_timeout: float
    description: str


POLICIES: dict[str, MissingGpuPolicy] = {
    policy.name: policy
    for policy in (
        MissingGpuPolicy("fail", False, False, 300.0, "fail fast, naming what was requested and what exists"),
        MissingGpuPolicy("wait", True, False, 86400.0, "wait until the GPUs are free"),
        MissingGpuPolicy("cpu", False, True, 300.0, "run on the CPU instead, with a warning"),
    )
}
NAMES: tuple[str, ...] = tuple(POLICIES)

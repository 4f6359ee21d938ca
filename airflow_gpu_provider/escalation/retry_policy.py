"""Airflow's retry policy (3.3) for GPU tasks: :class:`GpuRetryPolicy`, which decides by the class of a failed try.

A failed GPU try has a class (``runtime/failures.py``; a pod the cluster made fail: the Kubernetes backend's
``failures.py``): the **application**'s (its code raised), the **resources**' (it ran out of GPU or host memory) or
the **infrastructure**'s (an Xid after which the GPU needs a reset, an uncorrectable ECC error, an NCCL or gloo
timeout, a pod evicted, preempted or lost with its node). The policy runs in the task's worker process with the
error the operator raised (:func:`failure_class`) and answers with Airflow's own ``RetryDecision``: the reason it
gives names the class and its evidence (``infrastructure: Xid 79 on GPU 0 (GPU-...): GPU has fallen off the bus``),
and Airflow shows it for the try (the task instance's ``retry_reason``, and the log).

The GPU operators use one when the DAG sets none (:class:`DefaultRetryPolicy`): it retries as Airflow would, and
says why. ``[gpu] infra_retries`` is the other half (``infrastructure.py``): it runs an infrastructure failure again
at once without spending one of the task's retries; the policy decides once those are used up. docs/resilience.md
puts both side by side.

Airflow before 3.3 has no retry policies: there :class:`GpuRetryPolicy` refuses to be built, saying so, and the
operators have none.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Literal

from airflow_gpu_provider.dag_line import entry_point
from airflow_gpu_provider.exceptions import InvalidSettingError
from airflow_gpu_provider.runtime.protocol import APPLICATION, INFRASTRUCTURE
from airflow_gpu_provider.task.result import failure_class_of

if TYPE_CHECKING:
    from airflow.sdk.definitions.retry_policy import RetryDecision, RetryPolicy
else:
    try:
        from airflow.sdk.definitions.retry_policy import RetryDecision, RetryPolicy
    except ImportError:  # Airflow before 3.3
        RetryDecision, RetryPolicy = None, object

#: Whether this Airflow has retry policies (``retry_policy=``, 3.3 and later).
HAS_RETRY_POLICIES = RetryDecision is not None
APPLICATION_CHOICES = ("retry", "fail")
MAX_REASON = 500  # what Airflow keeps of a reason (TaskInstance.retry_reason)


@dataclass(frozen=True)
class GpuRetryPolicy(RetryPolicy):
    """Retry or fail a GPU task by the class of its failed try, with a reason that names the class and its evidence.

    Pass it as ``retry_policy=`` to a task or in a DAG's ``default_args``; the GPU operators use
    ``GpuRetryPolicy()`` when the DAG sets none. It can fail a task early or change a retry's delay, never add tries
    (Airflow's rule): a task without ``retries`` is not retried whatever it says.

    :param application: an error of the task's own code: ``"retry"`` (the task's ``retries``, as Airflow does) or
        ``"fail"`` (at once: running the same code again would fail the same way)
    :param infrastructure_delay: the delay before the retry of a try that failed because of the infrastructure
        (seconds or a ``timedelta``); ``None``: the task's ``retry_delay``. The retry avoids what failed: the GPU is
        quarantined on its host, the node is avoided by the next pod.

    An out-of-memory failure is always retried: the next try climbs the task's ``on_oom`` ladder (or, on the local
    and Docker backends, asks for a GPU with more memory); past its top the next try fails at once, saying why. An
    error that is no GPU try's (the operator's own checks, Airflow's) gets Airflow's default.
    """

    application: Literal["retry", "fail"] = "retry"
    infrastructure_delay: timedelta | float | None = None

    @entry_point()
    def __post_init__(self) -> None:
        if not HAS_RETRY_POLICIES:
            from airflow import __version__ as airflow_version

            raise InvalidSettingError(
                "GpuRetryPolicy",
                "airflow",
                airflow_version,
                "retry policies (retry_policy=) are new in Airflow 3.3",
                "Airflow 3.3 or later; before it, [gpu] infra_retries and the task's retries",
            )
        if self.application not in APPLICATION_CHOICES:
            raise InvalidSettingError(
                "GpuRetryPolicy", "application", self.application, "unknown value", "'retry' or 'fail'"
            )
        delay = self.infrastructure_delay
        seconds = delay.total_seconds() if isinstance(delay, timedelta) else delay
        if seconds is not None and (
            isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 <= seconds <= 10**9
        ):
            raise InvalidSettingError(
                "GpuRetryPolicy",
                "infrastructure_delay",
                delay,
                "not a delay",
                "seconds (0 to 1e9), a timedelta or None",
            )
        object.__setattr__(self, "infrastructure_delay", None if seconds is None else timedelta(seconds=seconds))

    def evaluate(self, exception: BaseException, try_number: int, max_tries: int, context: Any = None) -> RetryDecision:
        """Airflow's decision for the failed try: by its class, with the class and its evidence as the reason.

        The last try (no retries left) gets Airflow's default, which fails it: a decision would log a "retry" that
        cannot happen.
        """
        found = failure_class_of(exception)
        if found is None or try_number > max_tries:
            return RetryDecision.default()
        klass, evidence = found
        reason = f"{klass}: {evidence}"[:MAX_REASON]
        if klass == APPLICATION and self.application == "fail":
            return RetryDecision.fail(reason=reason)
        delay = self.infrastructure_delay if klass == INFRASTRUCTURE else None  # a timedelta once built
        return RetryDecision.retry(delay=delay if isinstance(delay, timedelta) else None, reason=reason)

    def serialize(self) -> dict[str, Any]:
        """JSON for DAG serialisation: the options (the delay in seconds)."""
        delay = self.infrastructure_delay
        seconds = delay.total_seconds() if isinstance(delay, timedelta) else delay
        return {
            "__type": f"{__name__}.GpuRetryPolicy",
            "application": self.application,
            "infrastructure_delay": seconds,
        }

    @classmethod
    def deserialize(cls, data: dict[str, Any]) -> GpuRetryPolicy:
        """The policy :meth:`serialize` wrote."""
        return cls(application=data.get("application", "retry"), infrastructure_delay=data.get("infrastructure_delay"))


class DefaultRetryPolicy:
    """The GPU operators' ``retry_policy``: the one the DAG gave, else ``GpuRetryPolicy()`` (on Airflow 3.3+).

    A data descriptor on the operator class: ``BaseOperator.__init__`` sets ``retry_policy`` (``None`` when the DAG
    gives none) and the task runner reads it back; the value is kept under ``_retry_policy``.
    """

    def __get__(self, operator: Any, owner: type | None = None) -> Any:
        if operator is None:
            return None  # the class's default, as BaseOperator's
        given = operator.__dict__.get("_retry_policy")
        return given if given is not None or not HAS_RETRY_POLICIES else _default()

    def __set__(self, operator: Any, value: Any) -> None:
        operator.__dict__["_retry_policy"] = value


@functools.cache
def _default() -> GpuRetryPolicy:
    return GpuRetryPolicy()

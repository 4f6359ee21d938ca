"""A deferred single-pod run (``deferrable=True``): KubernetesPodOperator's own deferrable mode, driven by the backend.

``start``: ``GpuPodOperator(deferrable=True)`` creates the pod (``execute_async``, what its ``execute`` runs), or
takes over the one an earlier try left running (KubernetesPodOperator's reattach, through the task state store), and
raises ``TaskDeferred`` with its ``KubernetesPodTrigger``; that becomes a
:class:`~airflow_gpu_provider.backends.base.Deferral`: the trigger, the method to re-enter and its kwargs (JSON), and
KubernetesPodOperator's deferral timeout (the task's ``execution_timeout`` and a margin).

``resume``: the same operator, built again from the plan, re-enters through that method (``trigger_reentry``): it
reads the pod, prints its log, reads the result envelope through the XCom sidecar and deletes the pod as
``on_finish_action`` says. A failure is explained as ``run()`` explains it (``GpuPodOperator.explain_failure``); the
trigger's ``timeout`` event (the pod not scheduled in ``pending_timeout``, not started in ``startup_timeout``, or
past the task's ``execution_timeout``) first asks the scheduler why, as ``run()`` does, so that
``on_missing_gpu="cpu"`` still starts the CPU-only pod (deferred in its turn).
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.providers.common.compat.sdk import TaskDeferred
from kubernetes.client import models as k8s

from airflow_gpu_provider.backends.base import Deferral
from airflow_gpu_provider.backends.kubernetes.pod_operator import GpuPodOperator, build_operator
from airflow_gpu_provider.exceptions import GpuTaskError, GpuUnavailableError
from airflow_gpu_provider.task.result import TaskResult, task_result

if TYPE_CHECKING:
    import logging

    from airflow.sdk import Context

    from airflow_gpu_provider.backends.kubernetes.plan import KubernetesPlan


def execution_timeout(context: Context | None) -> timedelta | None:
    """The running task's ``execution_timeout`` (the GPU task's own, not the pod operator's), if any."""
    task = (context or {}).get("task")
    value = getattr(task, "execution_timeout", None)
    return value if isinstance(value, timedelta) else None


def json_state(value: dict[str, Any], what: str) -> dict[str, Any]:
    """``value`` as the JSON it will be stored as (a Deferral's state travels through the metadata database)."""
    try:
        return dict(json.loads(json.dumps(value)))
    except (TypeError, ValueError) as err:
        raise GpuTaskError(f"The {what} of a deferral is not JSON ({err}); the task cannot defer.") from err


class DeferredPod:
    """Starts and resumes the deferred pod of a plan (or of its CPU fallback); ``on_kill`` deletes it."""

    def __init__(self, plan: KubernetesPlan, log: logging.Logger) -> None:
        self.plan = plan
        self.log = log
        self.operator: GpuPodOperator | None = None

    def _plan(self, cpu_fallback: bool) -> KubernetesPlan:
        if not cpu_fallback:
            return self.plan
        if self.plan.cpu_fallback is None:
            raise GpuTaskError("The deferred task ran its CPU fallback pod, but its plan has none now.")
        return self.plan.cpu_fallback

    def _operator(self, plan: KubernetesPlan, context: Context) -> GpuPodOperator:
        self.operator = build_operator(plan, deferrable=True, execution_timeout=execution_timeout(context))
        return self.operator

    def start(self, context: Context, *, cpu_fallback: bool = False) -> TaskResult | Deferral:
        """Create the pod (or take over the earlier try's) and defer to KubernetesPodTrigger."""
        plan = self._plan(cpu_fallback)
        operator = self._operator(plan, context)
        try:
            # KubernetesPodOperator.execute(context) with deferrable=True, without the "execute cannot be called
            # outside of the Task Runner" warning of an operator run inside another (as run() calls execute_sync)
            operator.execute_async(context)
        except TaskDeferred as deferred:
            return self._deferral(deferred, operator, cpu_fallback)
        except Exception as err:
            explained = self._explain(operator, plan, None)
            if not self._falls_back(explained, cpu_fallback):
                if explained is None:
                    raise
                raise explained from err
            return self.start(context, cpu_fallback=True)
        # the pod taken over was over already: KubernetesPodOperator re-entered at once, without deferring
        return task_result(operator.result_envelope, 0, where=f"pod {operator.pod_label}")

    def resume(self, state: dict[str, Any], event: Any, context: Context) -> TaskResult | Deferral:
        """Re-enter KubernetesPodOperator where it deferred (``state["method"]``) with the trigger's event."""
        cpu_fallback = bool(state.get("cpu_fallback"))
        plan = self._plan(cpu_fallback)
        operator = self._operator(plan, context)
        reentry = _reentry(operator, state.get("method"))
        try:
            if isinstance(event, dict) and event.get("status") == "timeout":
                operator.timed_out = True
                name, namespace = event.get("name"), event.get("namespace")
                operator.diagnose_pending(k8s.V1Pod(metadata=k8s.V1ObjectMeta(name=name, namespace=namespace)))
            envelope = reentry(context, event, **(state.get("kwargs") or {}))
        except TaskDeferred as deferred:  # the pod still runs (KubernetesPodOperator re-defers up to 3 times)
            return self._deferral(deferred, operator, cpu_fallback)
        except Exception as err:
            explained = self._explain(operator, plan, event)
            if not self._falls_back(explained, cpu_fallback):
                if explained is None:
                    raise
                raise explained from err
            return self.start(context, cpu_fallback=True)
        if envelope is None:
            envelope = operator.result_envelope
        if envelope is None:
            self.log.warning("Pod %s left no result envelope (gone before it could be read)", operator.pod_label)
        return task_result(envelope, 0, where=f"pod {operator.pod_label}")

    def _deferral(self, deferred: TaskDeferred, operator: GpuPodOperator, cpu_fallback: bool) -> Deferral:
        pod = operator.pod
        state = {
            "method": deferred.method_name,
            "kwargs": deferred.kwargs or {},
            "pod": {"name": pod.metadata.name, "namespace": pod.metadata.namespace} if pod is not None else None,
            "cpu_fallback": cpu_fallback,
        }
        try:
            state = json_state(state, "state")
        except GpuTaskError:
            operator.on_kill()  # nothing could resume it
            raise
        timeout = deferred.timeout
        if isinstance(timeout, (int, float)):
            timeout = timedelta(seconds=timeout)
        self.log.info("Pod %s started; the task defers to %s", operator.pod_label, type(deferred.trigger).__name__)
        operator.log_kueue_wait(pod, self.log)
        return Deferral(trigger=deferred.trigger, state=state, timeout=timeout)

    @staticmethod
    def _explain(operator: GpuPodOperator, plan: KubernetesPlan, event: Any) -> Exception | None:
        """The typed error of a failed pod, as ``run()`` gives it; a clear one for the trigger's timeout event."""
        explained = operator.explain_failure(plan)
        if explained is None and isinstance(event, dict) and event.get("status") == "timeout":
            explained = GpuTaskError(
                f"Pod {operator.pod_label} timed out while the task was deferred (KubernetesPodTrigger): "
                f"{event.get('message') or 'no message'}. The pod was removed as on_finish_action says."
            )
        return explained

    def _falls_back(self, explained: Exception | None, cpu_fallback: bool) -> bool:
        """Whether the CPU-only pod runs instead (``on_missing_gpu="cpu"`` and no node had the GPUs)."""
        if isinstance(explained, GpuUnavailableError) and not cpu_fallback and self.plan.cpu_fallback is not None:
            self.log.warning("%s Running the task on CPU instead (on_missing_gpu='cpu').", explained)
            return True
        return False

    def on_kill(self) -> None:
        """Delete the pod (KubernetesPodOperator's ``on_kill``)."""
        if self.operator is not None:
            self.operator.on_kill()


def _reentry(operator: GpuPodOperator, method: Any) -> Any:
    """KubernetesPodOperator's method that the deferral named (its public re-entry, ``trigger_reentry``)."""
    target = getattr(operator, method, None) if isinstance(method, str) and not method.startswith("_") else None
    if not callable(target):
        raise GpuTaskError(f"The deferred pod cannot be resumed: {method!r} is not KubernetesPodOperator's re-entry.")
    return target

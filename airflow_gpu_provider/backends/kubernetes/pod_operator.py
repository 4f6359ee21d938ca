"""The plan -> a KubernetesPodOperator (run time: imports the kubernetes client).

:class:`GpuPodOperator` is KubernetesPodOperator with three small additions: it keeps the runtime's result envelope
read from the XCom sidecar, it asks the scheduler why a pod never started (in the worker, or after the trigger's
``timeout`` event), and it leaves XCom pushing to ``GpuStepOperator`` (which pushes the function's return value, not
the envelope). Everything else is
KubernetesPodOperator's own: the pod's creation, its reattach to an earlier try's pod (through the task state store
on Airflow 3.3+), its deferrable mode (:mod:`.deferral`), its log streaming and cleanup.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

from airflow.providers.cncf.kubernetes import version_compat
from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator
from airflow.providers.cncf.kubernetes.utils.pod_manager import PodLaunchFailedException, PodLaunchTimeoutException
from airflow.sdk.definitions._internal.contextmanager import DagContext
from kubernetes.client import ApiClient, Configuration
from kubernetes.client import models as k8s
from kubernetes.client.exceptions import ApiException

from airflow_gpu_provider.backends.kubernetes.companions import WithCompanions
from airflow_gpu_provider.backends.kubernetes.container import ENVELOPE_ENV, envelope_variable
from airflow_gpu_provider.backends.kubernetes.failures import cluster_error, unschedulable_failure
from airflow_gpu_provider.backends.kubernetes.kueue import kueue_queue, waiting_line, waiting_queue
from airflow_gpu_provider.backends.kubernetes.pending import Unschedulable, termination_error, unschedulable
from airflow_gpu_provider.backends.kubernetes.plan import KubernetesPlan
from airflow_gpu_provider.backends.pods import dra
from airflow_gpu_provider.exceptions import GpuUnavailableError, RemoteTaskError
from airflow_gpu_provider.policy.pods import final
from airflow_gpu_provider.task.result import result_value

_API = ApiClient(configuration=Configuration())
#: While a deferred pod runs, KubernetesPodTrigger writes its new log lines into the task's log this often.
LOGGING_INTERVAL_S = 5
#: KubernetesPodOperator's switch for taking over the pod of an earlier try: its ``durable=`` (cncf-kubernetes 10.21+)
#: on Airflow 3.3+ (the pod's identity kept in the task state store, then a label search; the registry's "Durable"),
#: ``reattach_on_restart`` before (the label search; ``durable`` only warns there that it does nothing).
_DURABLE = "durable" in inspect.signature(KubernetesPodOperator.__init__).parameters and getattr(
    version_compat, "AIRFLOW_V_3_3_PLUS", False
)


def to_dict(obj: Any) -> Any:
    """A kubernetes client object as the API's plain (camelCase) dict."""
    return _API.sanitize_for_serialization(obj)


def to_model(data: Any, klass: str) -> Any:
    """An API dict as a kubernetes client object (the deserializer KubernetesPodOperator's templates use)."""
    return _API._ApiClient__deserialize(data, klass)  # type: ignore[attr-defined]


class GpuPodOperator(WithCompanions, KubernetesPodOperator):
    """KubernetesPodOperator that checks its pod, keeps the result envelope, diagnoses pods that never started.

    Its pod's companions (the Secret with the envelope, the DRA claim template) are created, owned and deleted with
    the pod (:class:`~.companions.WithCompanions`).

    :param pod_security: the Pod Security Standards level every pod it builds must meet
    :param claim: the spec of the pod's DRA claim (``KubernetesPlan.claim``)
    :param envelope: the task's envelope (``KubernetesPlan.envelope``), in the task's Secret
    :param allowed: the cluster objects the pod may name (``KubernetesPlan.allowed``); with the namespace the
        connection gives
    """

    def __init__(
        self,
        *,
        pod_security: str = "restricted",
        claim: dict[str, Any] | None = None,
        envelope: str = "",
        allowed: dict[str, frozenset[str]] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.pod_security, self.claim, self.envelope, self.allowed = pod_security, claim, envelope, allowed or {}
        self.result_envelope: dict[str, Any] | None = None
        self.unschedulable: Unschedulable | None = None
        self.last_read: dict[str, Any] | None = None  # the pod as diagnose_pending read it (an image pull failure)
        self.timed_out = False  # resumed from the trigger's timeout event: the pod may still run

    def build_pod_request_obj(self, context: Any = None, *, dry_run: bool = False) -> k8s.V1Pod:
        """The pod as KubernetesPodOperator builds it, through the final check (``policy.pods.final``).

        Checked after every merge: the template, the XCom sidecar, Airflow's ``pod_mutation_hook``; a pod that breaks
        its level or names what the allow-list does not hold raises
        :class:`~airflow_gpu_provider.policy.pods.PodSecurityError`, and every container without a GPU gets its
        device isolation. Both ``execute`` and rendering build the pod here: nothing is submitted or shown that was
        not checked.
        """
        pod = to_dict(super().build_pod_request_obj(context, dry_run=dry_run))
        name, spec = pod["metadata"]["name"], pod["spec"]
        base = next(c for c in spec["containers"] if c["name"] == self.base_container_name)
        variables = [v for v in base.get("env") or [] if v.get("name") != ENVELOPE_ENV]
        base["env"] = [*variables, envelope_variable(name)]  # the envelope: its Secret's (.companions)
        if self.claim is not None:  # the claim, made from the pod's own template; the task's container uses it
            spec["resourceClaims"] = dra.pod_claims(dra.template_name(name))
            base.setdefault("resources", {})["claims"] = dra.container_claims()
        checked = final(pod, self.pod_security, f"pod {name} of task {self.task_id}", self.allowed_here())
        return to_model(checked, "V1Pod")

    def allowed_here(self) -> dict[str, frozenset[str]]:
        """``allowed``, with the namespace a pod gets that names none: the connection's, the worker pod's, default."""
        namespace = self.hook.get_namespace() or self._incluster_namespace or "default"
        return {**self.allowed, "namespace": self.allowed.get("namespace", frozenset()) | {namespace}}

    @property
    def pod_label(self) -> str:
        """``namespace/name`` of the pod (once built)."""
        pod = self.pod or self.pod_request_obj
        return f"{pod.metadata.namespace}/{pod.metadata.name}" if pod is not None else self.task_id

    def extract_xcom(self, pod: k8s.V1Pod, *, ignore_kill_failure: bool = True) -> dict[Any, Any] | None:
        """Read the runtime's result envelope through the XCom sidecar and keep it (also when the pod failed)."""
        self.result_envelope = super().extract_xcom(pod, ignore_kill_failure=ignore_kill_failure)
        return self.result_envelope

    def await_pod_start(self, pod: k8s.V1Pod) -> None:
        """Wait for the pod to start; if it never gets a node, record the scheduler's reason and delete it.

        The pod is deleted whatever ``on_finish_action`` says: kept, it could still be scheduled later and run the
        task a second time, next to the CPU fallback or a retry. A pod that Kueue gated is said to wait for admission.
        """
        self.log_kueue_wait(pod)
        try:
            super().await_pod_start(pod)
        except (PodLaunchFailedException, PodLaunchTimeoutException):  # the timeout is no subclass of the failure
            self.diagnose_pending(pod)
            raise

    def log_kueue_wait(self, pod: k8s.V1Pod | None, log: Any = None) -> None:
        """Say so in the log when the pod waits for Kueue's admission (read once: Kueue's webhook gated it).

        Only a pod in a Kueue queue is read; one that cannot be read is not reported.
        """
        if pod is None or kueue_queue(to_dict(pod)) is None:
            return
        try:
            queue = waiting_queue(to_dict(self.pod_manager.read_pod(pod)))
        except ApiException:
            return
        if queue is not None:
            (log or self.log).info("%s", waiting_line(f"Pod {self.pod_label}", queue))

    def diagnose_pending(self, pod: k8s.V1Pod) -> None:
        """Record the scheduler's verdict on a pod that did not start; delete it if no node can take it.

        Called when the start timed out: in the worker (``await_pod_start``), or on resuming from the trigger's
        ``timeout`` event (:mod:`.deferral`).
        """
        try:
            remote = self.pod_manager.read_pod(pod)
            self.last_read = to_dict(remote)
            events = [e.message or "" for e in self.pod_manager.read_pod_events(pod).items]
            self.unschedulable = unschedulable(to_dict(remote), events)
            if self.unschedulable is not None:
                self.patch_already_checked(remote, reraise=False)  # no later start takes it over while it goes
                self.pod_manager.delete_pod(pod)
        except ApiException:
            self.log.warning("Could not read or delete pod %s that did not start", self.pod_label)

    def _write_logs(self, pod: k8s.V1Pod, follow: bool = False, since_time: Any = None) -> None:  # type: ignore[override]
        """The pod's log; after a timeout event not followed, which would wait for a running pod to end."""
        super()._write_logs(pod, follow=follow and not self.timed_out, since_time=since_time)

    def _push_xcom_with_fan_out(self, ti: Any, value: Any) -> None:
        """No XCom from a failed pod: GpuStepOperator pushes the function's return value itself."""

    def explain_failure(self, plan: KubernetesPlan) -> Exception | None:
        """A typed error for a failed run, else None.

        No node; the cluster's doing (``failures.py``); the user's exception; a killed container.
        """
        limits = plan.resources.get("limits", {})
        if self.unschedulable is not None:
            unavailable = GpuUnavailableError(self.unschedulable.explain(plan.pending_timeout, limits))
            unavailable.failure = unschedulable_failure(str(unavailable))
            return unavailable
        where = f"pod {self.pod_label}"
        # the pod as last read: ``remote_pod`` in the worker's run, ``pod`` once ``trigger_reentry`` has read it
        remote = self.remote_pod if self.remote_pod is not None else self.pod
        cluster = cluster_error(where, self.last_read, None if remote is None else to_dict(remote))
        if cluster is not None:  # the cluster's doing, whatever the task's code said as it was stopped
            return cluster
        if self.result_envelope is not None and not self.result_envelope.get("ok", False):
            try:
                result_value(self.result_envelope, 1, where=where)
            except RemoteTaskError as err:
                node = None if remote is None else getattr(remote.spec, "node_name", None)
                if err.failure is not None and node:  # the runtime's node is the pod's name: the next try avoids this
                    err.failure.update(pod=err.failure.get("node"), node=node)
                return err
        if remote is not None:
            return termination_error(to_dict(remote), self.base_container_name, limits)
        return None


@contextlib.contextmanager
def _outside_any_dag() -> Iterator[None]:
    """Operators made here join no DAG, even inside a ``with DAG(...)`` block (as Airflow's own helpers do)."""
    DagContext.push(None)  # type: ignore[arg-type]
    try:
        yield
    finally:
        DagContext.pop()


def build_operator(
    plan: KubernetesPlan, *, deferrable: bool = False, execution_timeout: timedelta | None = None
) -> GpuPodOperator:
    """A :class:`GpuPodOperator` for the plan (not attached to any DAG).

    :param deferrable: KubernetesPodOperator's deferrable mode: ``execute`` creates the pod (or takes over the
        earlier try's) and raises ``TaskDeferred`` with its ``KubernetesPodTrigger``; else run it with ``execute_sync``
    :param execution_timeout: the task's, which KubernetesPodOperator hands the trigger as the pod's deadline
    """
    options = plan.options
    security = to_model(plan.security_context, "V1SecurityContext")
    with _outside_any_dag():
        return _pod_operator(plan, options, security, deferrable=deferrable, execution_timeout=execution_timeout)


def durable_arguments(durable: bool) -> dict[str, bool]:
    """KubernetesPodOperator's arguments for ``TaskRequest.durable`` (``False``: its opt-out, a new pod a try)."""
    if _DURABLE:
        return {"durable": durable}  # it sets reattach_on_restart to the same value
    return {} if durable else {"reattach_on_restart": False}  # True is the default; the argument warns


def _pod_operator(plan: KubernetesPlan, options: Any, security: Any, **mode: Any) -> GpuPodOperator:
    return GpuPodOperator(
        **mode,
        logging_interval=LOGGING_INTERVAL_S if mode.get("deferrable") else None,
        **durable_arguments(plan.durable),
        pod_security=options.pod_security,
        claim=plan.claim,
        envelope=plan.envelope,
        allowed=plan.allowed,
        task_id=plan.task_id,
        kubernetes_conn_id=options.kubernetes_conn_id,
        namespace=options.namespace,
        in_cluster=options.in_cluster,
        cluster_context=options.cluster_context,
        config_file=options.config_file,
        image=plan.image,
        image_pull_policy=options.image_pull_policy,
        image_pull_secrets=[k8s.V1LocalObjectReference(name=name) for name in options.image_pull_secrets],
        cmds=list(plan.command),
        arguments=list(plan.args),
        env_vars=[k8s.V1EnvVar(name=name, value=value) for name, value in plan.environment.items()],
        container_resources=to_model(plan.resources, "V1ResourceRequirements"),
        volumes=[to_model(v, "V1Volume") for v in plan.volumes],
        volume_mounts=[to_model(m, "V1VolumeMount") for m in plan.volume_mounts],
        init_containers=[to_model(c, "V1Container") for c in plan.init_containers],
        node_selector=dict(plan.node_selector),
        tolerations=[to_model(t, "V1Toleration") for t in plan.tolerations],
        affinity=to_model(plan.affinity, "V1Affinity") if plan.affinity else None,
        labels=dict(plan.labels),
        annotations=dict(plan.annotations),
        service_account_name=options.service_account_name,
        priority_class_name=options.priority_class_name,
        runtime_class_name=options.runtime_class_name,
        security_context=to_model(plan.pod_security_context, "V1PodSecurityContext")
        if plan.pod_security_context
        else None,
        container_security_context=security,
        xcom_sidecar_container_security_context=to_model(plan.security_context, "V1SecurityContext"),
        pod_template_dict=plan.pod_template,
        termination_grace_period=plan.termination_grace_period,
        on_finish_action=options.on_finish_action,
        do_xcom_push=True,
        get_logs=True,
        init_container_logs=True,
        log_events_on_failure=True,
        log_pod_spec_on_failure=False,  # the spec carries the shipped code; the events say what went wrong
        schedule_timeout_seconds=int(plan.pending_timeout),
        startup_timeout_seconds=int(options.startup_timeout),
    )

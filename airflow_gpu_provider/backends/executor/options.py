"""``backend_options`` of the executor backend: the worker host's (as local) and where the executor sends the task."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from airflow_gpu_provider.backends.options import BadOption, WorkerOptions, option, text
from airflow_gpu_provider.backends.pods.options import PodOptions

#: A ResourceClaimTemplate the deployment's admin created: the worker pod's GPUs come from DRA claims made from it
#: (a ``pod_override`` cannot create the template; docs/kubernetes-admin.md).
CLAIM_TEMPLATE_OPTION = "dra_claim_template"
#: The options that shape a KubernetesExecutor worker pod: the pod options the kubernetes backend takes too.
POD_OPTIONS: tuple[str, ...] = tuple(sorted({*PodOptions.names(), CLAIM_TEMPLATE_OPTION}))
QUEUE = re.compile(r"^[A-Za-z0-9_.\-{}]+$")


def _queue(value: Any) -> str:
    if not isinstance(value, str) or not QUEUE.fullmatch(value) or value.replace("{accelerator}", "").count("{"):
        raise BadOption(
            "not a queue name", "letters, digits, '-', '_', '.', and {accelerator}, e.g. 'gpu-{accelerator}'"
        )
    return value


def _pod_options(value: Any) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise BadOption("expected a mapping of Kubernetes backend options", f"a dict with keys among {POD_OPTIONS}")
    unknown = sorted(str(key) for key in value if key not in POD_OPTIONS)
    if unknown:
        raise BadOption(
            f"{', '.join(unknown)} do not shape a KubernetesExecutor worker pod", ", ".join(POD_OPTIONS), value=unknown
        )
    return dict(value)


@dataclass(frozen=True)
class ExecutorOptions(WorkerOptions):
    """The executor backend's options. See ``docs/executors.md``.

    :param executor: the executor GPU tasks go to, instead of ``[gpu] executor``
    :param queue: the queue of GPU tasks (CeleryExecutor, Edge), instead of ``[gpu] queue``
    :param kubernetes: for KubernetesExecutor, the Kubernetes backend's options that shape the worker pod
        (:data:`POD_OPTIONS`: label scheme, selectors, tolerations, security), checked by that backend's checks
    """

    backend: ClassVar[str] = "executor"

    executor: str | None = option(check=text)
    queue: str | None = option(check=_queue)
    kubernetes: Mapping[str, Any] | None = option(check=_pod_options)

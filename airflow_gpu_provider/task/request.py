"""What every backend receives: one task try as a :class:`TaskRequest` (what it gives back: :mod:`.result`).

The operator builds the request when the try starts, from its settled task (``operators/spec.py``); a backend only
translates it (``plan``) and runs it (``run``). The request holds settings and the envelope, never a backend's own
options, and is the one way a backend learns what the task asked for (resume included).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from airflow_gpu_provider.settings import ImageSettings, ResourceSettings
from airflow_gpu_provider.task.envelope import Envelope, summary
from airflow_gpu_provider.task.labels import display_name
from airflow_gpu_provider.task.missing_gpu import POLICIES, MissingGpuPolicy, OnMissingGpu

_ENVELOPE_FIELDS = frozenset(f.name for f in dataclasses.fields(Envelope))

if TYPE_CHECKING:
    from airflow_gpu_provider.checkpoint.location import CheckpointLocation


@dataclass(frozen=True)
class TaskRequest:
    """Everything a backend needs to run one task try, independent of the backend.

    :param envelope: what the runtime runs (:class:`~.envelope.Envelope`)
    :param on_missing_gpu: the name of a :data:`~airflow_gpu_provider.task.missing_gpu.POLICIES` entry
    :param labels: identity of the task try (dag_id, task_id, run_id, try_number, map_index) for names and logs
    :param num_nodes: machines the envelope runs on at once (a multi-node launch); ``resources`` are per node
    :param rendezvous_port: the port a multi-node launch meets on (``None``: the backend's default)
    :param min_gpu_memory: GPUs must have more memory than this (bytes): a try after a GPU out-of-memory failure,
        on the backends that pick devices themselves (local, Docker)
    :param right_size: a right-sized try (``right_size=True``, ``telemetry/right_size.py``): ``need``, the bytes
        each GPU must hold (the host allocator takes the smallest that do: local, Docker), and the decision's evidence
    :param checkpoint: the try's checkpoint folder (``checkpoint/location.py``), ``None`` for none
    :param resume: resume from the newest checkpoint of that folder
    :param durable: a later try of the same task instance takes over the job an earlier try left running (a
        container, a pod, a Ray job) instead of starting a second one (the task's ``durable=``, Airflow's durable
        contract: docs/resilience.md); ``False``: it starts afresh
    :param defer_wait: ``on_missing_gpu="wait"`` defers to the triggerer instead of waiting in the worker: the host
        allocator raises :class:`~airflow_gpu_provider.host.allocator.MustWait` rather than sleep
    :param avoid_nodes: the nodes where an earlier try failed because of the infrastructure (a GPU fault, an
        eviction, a lost node: ``escalation/infrastructure.py``): the Kubernetes backend keeps the pod off them
    :param project_path: the worker's folders of the task's project code (the DAG file's, the bundle's root): the
        backends whose task runs on the worker put them first on its ``PYTHONPATH`` (``task/modules.py``)
    """

    resources: ResourceSettings
    image: ImageSettings
    envelope: Envelope
    on_missing_gpu: OnMissingGpu = "fail"
    labels: Mapping[str, str] = field(default_factory=dict)
    num_nodes: int = 1
    rendezvous_port: int | None = None
    min_gpu_memory: int | None = None
    right_size: Mapping[str, Any] | None = None
    checkpoint: CheckpointLocation | None = None
    resume: bool = False
    durable: bool = True
    defer_wait: bool = False
    project_path: tuple[str, ...] = ()
    avoid_nodes: tuple[str, ...] = ()

    def to_state(self) -> dict[str, Any]:
        """The request as JSON, to carry a try through a deferral (:meth:`from_state`).

        The image is left out: it is the task's (its settled spec gives it back), and its index URLs may hold
        credentials, which a deferral's state (stored in Airflow's metadata database) must not.
        """
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "image"}
        values.update(resources=self.resources.to_dict(), envelope=dataclasses.asdict(self.envelope))
        return json.loads(json.dumps(values))  # tuples as lists, as the database gives them back

    @classmethod
    def from_state(cls, state: Mapping[str, Any], image: ImageSettings) -> TaskRequest:
        """The request :meth:`to_state` carried, with the task's ``image``.

        A field this release does not know (a later release's) is dropped, one it lacks gets its default.
        """
        from airflow_gpu_provider.checkpoint.location import CheckpointLocation

        values = dict(state)
        if "reattach" in values:  # carried by a deferral of a release that called ``durable`` so
            values["durable"] = values.pop("reattach")
        known = {f.name for f in dataclasses.fields(cls)}
        values = {name: value for name, value in values.items() if name in known}
        checkpoint = values.get("checkpoint")
        return cls(
            **{
                **values,
                "resources": ResourceSettings(**values["resources"]),
                "image": image,
                "envelope": Envelope(**{k: v for k, v in values["envelope"].items() if k in _ENVELOPE_FIELDS}),
                "checkpoint": None if checkpoint is None else CheckpointLocation(*checkpoint),
                "project_path": tuple(values.get("project_path") or ()),
                "avoid_nodes": tuple(values.get("avoid_nodes") or ()),
            }
        )

    @property
    def missing_gpu(self) -> MissingGpuPolicy:
        """What to do when the GPUs are missing or busy."""
        return POLICIES[self.on_missing_gpu]

    @property
    def processes_per_node(self) -> int:
        """The processes that share one machine's resources: a launch's ranks per node (``launch["processes"]``)."""
        launch = self.envelope.launch or {}
        return max(1, int(launch.get("processes") or 1))

    @property
    def display_name(self) -> str:
        """``dag.task`` (plus map index), for log lines and lock holders."""
        return display_name(self.labels)

    def runtime_envelope(
        self,
        *,
        backend: str,
        image: str,
        gpus: list[dict[str, Any]] | None,
        cpu_fallback: bool = False,
        fallback_reason: str = "",
        die_with_parent: bool = False,
        modules_from: str | None = None,
        share: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """The envelope as the runtime reads it, with the summary that starts the task's log.

        :param backend: the backend's name, as the log shows it
        :param image: what the task runs in (the image, or the worker's Python and venv)
        :param gpus: the devices given to the task (``Device.describe()``), or ``None`` to let the runtime ask the
            driver (in a container or pod)
        :param cpu_fallback: the task runs on the CPU because its GPUs were missing (``on_missing_gpu="cpu"``)
        :param fallback_reason: why, in words (it goes into the profile)
        :param die_with_parent: the task process is SIGKILLed when its worker dies (the local backend's child)
        :param modules_from: the environment variable that carries the project modules' archive instead of the
            envelope (a pod's)
        :param share: a share of one GPU, as it is enforced (``host/mps.py`` ``Enforcement.share``)
        """
        task_summary = summary(
            self.resources,
            self.image,
            backend=backend,
            image_name=image,
            gpus=gpus,
            cpu_fallback=cpu_fallback,
            fallback_reason=fallback_reason,
        )
        if share is not None and not cpu_fallback:
            task_summary["share"] = dict(share)
        return self.envelope.to_json(
            summary=task_summary, resume=self.resume, die_with_parent=die_with_parent, modules_from=modules_from
        )

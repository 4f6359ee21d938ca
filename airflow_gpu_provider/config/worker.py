"""The worker's ``[gpu]`` and ``[gpu_policy]`` options, read once when a task starts: :class:`GpuConfig`.

A backend's ``plan()`` gets one and reads no configuration itself, so a plan is a pure function of the task's
request and this snapshot (and tests build either by hand).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from airflow_gpu_provider import config


@dataclass(frozen=True)
class GpuConfig:
    """Every ``[gpu]`` option, typed, and every ``[gpu_policy]`` one (``config/options.py``, ``config/policy.py``).

    Fields have no defaults here: each default is written once, in the options table.
    """

    backend: str
    on_missing_gpu: str
    devices: str
    extra_accelerators: str
    state_dir: str
    cache_size: str
    pool: str
    queue: str
    executor: str
    inventory: str
    poll_interval: float
    wait_timeout: float
    clear_cache_between_tasks: bool
    checkpoint_root: str
    checkpoint_cleanup: bool
    kill_grace: float
    quarantine_seconds: float
    infra_retries: int
    profile_interval: float
    prices: str
    allowed_mount_roots: str
    allowed_volumes: str
    allowed_capabilities: str
    allowed_users: str
    allowed_groups: str
    allowed_clusters: str
    allowed_network_modes: str
    allowed_ipc_modes: str
    allowed_build_paths: str
    allowed_checkpoint_roots: str
    min_pod_security: str
    allowed_objects: str
    allow_unenforced_gpu_shares: bool
    deployment: str

    @classmethod
    def read(cls, **overrides: object) -> GpuConfig:
        """The options as this process sees them now (environment first, then airflow.cfg, then defaults).

        :param overrides: values to use instead (tests, and a backend's own options that replace a ``[gpu]`` one)
        """
        section = config.policy_values()
        values = {
            field.name: config.policy_typed(field.name, section[field.name])
            if field.name in section
            else config.get(field.name)
            for field in dataclasses.fields(cls)
            if field.name not in overrides
        }
        return cls(**values, **overrides)  # type: ignore[arg-type]

    @classmethod
    def from_state(cls, carried: dict[str, object]) -> GpuConfig:
        """The options a deferral carried (``dataclasses.asdict``), read by this release, whichever wrote them.

        An option this release does not know (a release before or after it had it) is dropped; one the carried
        options lack is this process's (:meth:`read`): a deferred try resumes across an upgrade.
        """
        known = {field.name for field in dataclasses.fields(cls)}
        return cls.read(**{name: value for name, value in carried.items() if name in known})

    def grace(self, option: float | None) -> float:
        """Seconds between SIGTERM and SIGKILL: a backend option's value, else ``[gpu] kill_grace``.

        :param option: ``kill_grace`` (local), ``stop_timeout`` (Docker) or ``termination_grace_period`` (Kubernetes)
        """
        return self.kill_grace if option is None else float(option)

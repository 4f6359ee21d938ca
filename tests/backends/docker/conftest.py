"""Docker-engine fixtures (defined in ``docker_fixtures``, which the tests also import helpers from)."""

from __future__ import annotations

from docker_fixtures import docker_client, no_leaks, task_log, wheel_dir

__all__ = ["docker_client", "no_leaks", "task_log", "wheel_dir"]

"""The trigger a deferred Docker task waits on: it fires when the task's container has ended.

It reaches the engine the task used: the engine's URL is resolved on the worker (``docker_url``, ``$DOCKER_HOST`` or
the local socket) and handed over, and the triggerer checks it again against its own ``[gpu]
allowed_docker_engines`` (its default engine needs no listing): a trigger row is JSON in the metadata database,
never trusted by its content. The trigger logs in nowhere and reads no file a DAG named (TLS comes from the
triggerer's own ``DOCKER_CERT_PATH``). So the triggerer must reach that engine too: the local socket of the same host
(``[triggerer] queues_enabled = True`` and a triggerer per GPU host, started for its queue), or a listed
``docker_url`` both can reach (docs/deferrable.md). docker-py is synchronous:
each look at the container runs in a thread (``asyncio.to_thread``), and so does the first import of docker-py (a
few tenths of a second), so the triggerer's event loop never blocks.

A user who ends the deferred task (mark failed or success, clear) ends its container too: Airflow 3.3's triggerer
calls :meth:`DockerContainerTrigger.on_kill` for such an action (not on a triggerer restart, which only moves the
trigger). Before 3.3 nothing is called: the container runs to its end, and the orphan reaper removes it once its task
instance has ended (docs/deferrable.md).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

_ENDED = ("exited", "dead")
ENGINE_OPTIONS = ("docker_url", "api_version", "timeout")  # what a trigger takes to reach the engine, nothing more


class DockerContainerTrigger(BaseTrigger):
    """Fire when the container has ended (``exited``), is gone (``missing``) or at ``deadline`` (``timeout``).

    :param container_id: the task's container
    :param engine: how to reach the engine: ``docker_url`` (resolved), ``api_version``, ``timeout`` (anything else a
        stored row holds is ignored)
    :param poll_interval: seconds between two looks (``[gpu] trigger_poll_interval``)
    :param deadline: when the task times out (seconds since the epoch), or ``None``
    :param state: what the task's resume needs (the ``Deferral``'s state), echoed in every event: the event alone
        resumes the task, even where a runner passes on no more than the event (``dag.test()``)
    :param stop_timeout: the grace between SIGTERM and SIGKILL when a user ends the task (``on_kill``)
    """

    def __init__(
        self,
        container_id: str,
        engine: dict[str, Any],
        poll_interval: float = 1.0,
        deadline: float | None = None,
        *,
        state: dict[str, Any] | None = None,
        stop_timeout: float = 10.0,
    ) -> None:
        super().__init__()
        self.container_id = container_id
        self.engine = dict(engine)
        self.poll_interval = poll_interval
        self.deadline = deadline
        self.state = dict(state or {})
        self.stop_timeout = stop_timeout

    def serialize(self) -> tuple[str, dict[str, Any]]:
        """The classpath and the arguments the triggerer rebuilds the trigger from."""
        arguments = {
            "container_id": self.container_id,
            "engine": self.engine,
            "poll_interval": self.poll_interval,
            "deadline": self.deadline,
            "state": self.state,
            "stop_timeout": self.stop_timeout,
        }
        return f"{type(self).__module__}.{type(self).__qualname__}", arguments

    def _client(self) -> Any:
        from airflow_gpu_provider.backends.docker.client import connect
        from airflow_gpu_provider.backends.docker.options import DockerOptions

        reach = {name: self.engine[name] for name in ENGINE_OPTIONS if self.engine.get(name) is not None}
        return connect(DockerOptions.parse(reach), login=False)

    def _event(self, status: str, **details: Any) -> TriggerEvent:
        payload = {"status": status, "container_id": self.container_id, **details}
        return TriggerEvent({**payload, "state": {"phase": "run", "backend": self.state}})

    def _state(self, client: Any) -> dict[str, Any] | None:
        """The container's ``State``, or ``None`` when it is gone (in a thread: docker-py and its import block)."""
        from docker.errors import NotFound

        try:
            return dict(client.inspect_container(self.container_id)["State"])
        except NotFound:
            return None

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """Look at the container every ``poll_interval`` seconds, in a thread, until it ends."""
        client = await asyncio.to_thread(self._client)
        self.log.info("Watching container %s every %ss until it ends", self.container_id[:12], self.poll_interval)
        try:
            while True:
                state = await asyncio.to_thread(self._state, client)
                if state is None:
                    yield self._event("missing")
                    return
                if state.get("Status") in _ENDED:
                    yield self._event(
                        "exited", exit_code=state.get("ExitCode"), oom_killed=bool(state.get("OOMKilled"))
                    )
                    return
                if self.deadline is not None and time.time() >= self.deadline:
                    yield self._event("timeout")
                    return
                delay = self.poll_interval
                if self.deadline is not None:
                    delay = min(delay, max(self.deadline - time.time(), 0.01))
                await asyncio.sleep(delay)
        finally:
            client.close()

    def _stop(self) -> None:
        """Stop and remove the container (in a thread, as every docker-py call here)."""
        from airflow_gpu_provider.backends.docker.lifecycle import stop

        client = self._client()
        try:
            stop(client, self.container_id, self.stop_timeout)
        finally:
            client.close()

    async def on_kill(self) -> None:
        """A user ended the deferred task: stop its container (SIGTERM, SIGKILL after ``stop_timeout``), remove it."""
        self.log.warning("The task was ended by a user: stopping container %s", self.container_id[:12])
        await asyncio.to_thread(self._stop)

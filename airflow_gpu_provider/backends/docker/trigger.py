"""The trigger a deferred Docker task waits on: it logs the container's output, and fires when the container ended.

It reaches the engine the task used: the engine's URL is resolved on the worker (``docker_url``, ``$DOCKER_HOST`` or
the local socket) and handed over, and the triggerer checks it again against its own ``[gpu_policy]
allowed_clusters`` (its default engine needs no listing): a trigger row is JSON in the metadata database,
never trusted by its content. The trigger logs in nowhere and reads no file a DAG named (TLS comes from the
triggerer's own ``DOCKER_CERT_PATH``). So the triggerer must reach that engine too: the local socket of the same host
(``[triggerer] queues_enabled = True`` and a triggerer per GPU host, started for its queue), or a listed
``docker_url`` both can reach (docs/deferrable.md). docker-py is synchronous:
each look at the container runs in a thread (``asyncio.to_thread``), and so does the first import of docker-py (a
few tenths of a second), so the triggerer's event loop never blocks. The output is read by a thread of its own (a
blocking stream that may stay silent for hours must not hold one of the loop's workers), in the trigger's logging
context: the triggerer writes its lines into the task's log (Airflow 3 shows a trigger's log in its task's), each
at the time it was read. The event says whether all of it was logged, or until when: the resume logs only the rest.

The trigger reaches only its own task instance's container (its labels: the provider's, this deployment's, and the
task instance the triggerer runs it for): a trigger row another task wrote, naming another container, fires
``refused`` at once, having logged and stopped nothing. A user who ends the deferred task (mark failed or success,
clear) ends its container too: Airflow 3.3's triggerer
calls :meth:`DockerContainerTrigger.on_kill` for such an action (not on a triggerer restart, which only moves the
trigger). Before 3.3 nothing is called: the container runs to its end, and the orphan reaper removes it once its task
instance has ended (docs/deferrable.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

_ENDED = ("exited", "dead")
ENGINE_OPTIONS = ("docker_url", "api_version", "timeout")  # what a trigger takes to reach the engine, nothing more
DRAIN_S = 10.0  # how long the output may take to be read to its end once the container has ended


def _settle(future: asyncio.Future[bool], value: bool) -> None:
    if not future.done():
        future.set_result(value)


class DockerContainerTrigger(BaseTrigger):
    """Fire when the container has ended (``exited``), is gone (``missing``) or at ``deadline`` (``timeout``).

    :param container_id: the task's container
    :param engine: how to reach the engine: ``docker_url`` (resolved), ``api_version``, ``timeout`` (anything else a
        stored row holds is ignored)
    :param poll_interval: seconds between two looks (``[gpu] poll_interval``)
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
        self._stream: Any = None  # the container's output, while a thread reads it

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

    def _event(self, status: str, output: dict[str, Any], **details: Any) -> TriggerEvent:
        payload = {"status": status, "container_id": self.container_id, "output": output, **details}
        return TriggerEvent({**payload, "state": {"phase": "run", "backend": self.state}})

    def _log_output(self, loop: asyncio.AbstractEventLoop, done: asyncio.Future[bool]) -> None:
        """Log the container's output, all of it from its start, as it comes (a thread's); ``done``: read to its end.

        With a client of its own: the stream holds its connection until the container ends.
        """
        from airflow_gpu_provider.backends.docker.lifecycle import log_lines

        whole, client = False, None
        try:
            client = self._client()
            self._stream = client.logs(self.container_id, stdout=True, stderr=True, stream=True, follow=True)
            chunks = ((chunk, None) for chunk in self._stream)  # as lifecycle.output reads them
            log_lines(chunks, self.log)  # type: ignore[arg-type]  # Airflow's logger takes what logging's does
            whole = True
        except Exception as exc:  # noqa: BLE001 - the resume logs what was not logged here
            self.log.warning("Stopped reading the output of container %s: %s", self.container_id[:12], exc)
        finally:
            if client is not None:
                client.close()
            with contextlib.suppress(RuntimeError):  # the loop has closed: nobody waits for it
                loop.call_soon_threadsafe(_settle, done, whole)

    async def _output(self, followed: asyncio.Future[bool], *, ended: bool) -> dict[str, Any]:
        """What the event says of the output: all of it ``logged``, logged ``until`` a time, or nothing known."""
        if ended:  # the rest is still being read
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(followed), DRAIN_S)
        if followed.done():
            return {"logged": True} if followed.result() else {}
        return {"until": time.time()}

    def _state(self, client: Any) -> dict[str, Any] | None:
        """The container's ``State``, or ``None`` when it is gone (in a thread: docker-py and its import block)."""
        from docker.errors import NotFound

        try:
            return dict(client.inspect_container(self.container_id)["State"])
        except NotFound:
            return None

    def _ours(self, client: Any) -> bool:
        """Whether the container is this task instance's (:func:`.durable.belongs`); a gone one is (it fires)."""
        from docker.errors import APIError

        from airflow_gpu_provider.backends.docker.durable import belongs

        ti = self.task_instance  # set by the triggerer; not by dag.test(), which runs the trigger in the task itself
        identity = None if ti is None else {key: getattr(ti, key, None) for key in ("dag_id", "task_id", "run_id")}
        if identity is not None:
            identity["map_index"] = getattr(ti, "map_index", -1)
        try:
            return belongs(client.inspect_container(self.container_id), identity)
        except APIError as err:
            return getattr(err, "status_code", None) == 404

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """Log the container's output as it comes; look at the container every ``poll_interval`` s until it ends."""
        client = await asyncio.to_thread(self._client)
        if not await asyncio.to_thread(self._ours, client):
            client.close()
            self.log.error("Container %s is not this task's: nothing is watched", self.container_id[:12])
            yield self._event("refused", {})
            return
        self.log.info(
            "Watching container %s every %ss until it ends; its output follows as it is written",
            self.container_id[:12],
            self.poll_interval,
        )
        loop = asyncio.get_running_loop()
        followed: asyncio.Future[bool] = loop.create_future()
        reader = contextvars.copy_context()  # the trigger's: the triggerer routes its log lines to the task's log
        threading.Thread(
            target=reader.run, args=(self._log_output, loop, followed), name="docker-output", daemon=True
        ).start()
        try:
            while True:
                state = await asyncio.to_thread(self._state, client)
                if state is None:
                    yield self._event("missing", await self._output(followed, ended=False))
                    return
                if state.get("Status") in _ENDED:
                    output = await self._output(followed, ended=True)
                    yield self._event(
                        "exited", output, exit_code=state.get("ExitCode"), oom_killed=bool(state.get("OOMKilled"))
                    )
                    return
                if self.deadline is not None and time.time() >= self.deadline:
                    yield self._event("timeout", await self._output(followed, ended=False))
                    return
                delay = self.poll_interval
                if self.deadline is not None:
                    delay = min(delay, max(self.deadline - time.time(), 0.01))
                await asyncio.sleep(delay)
        finally:
            if self._stream is not None:
                await asyncio.to_thread(self._stream.close)  # the reading thread ends (a trigger moved elsewhere)
            client.close()

    def _stop(self) -> None:
        """Stop and remove the container (in a thread, as every docker-py call here)."""
        from airflow_gpu_provider.backends.docker.lifecycle import stop

        client = self._client()
        try:
            if self._ours(client):
                stop(client, self.container_id, self.stop_timeout)
        finally:
            client.close()

    async def on_kill(self) -> None:
        """A user ended the deferred task: stop its container (SIGTERM, SIGKILL after ``stop_timeout``), remove it."""
        self.log.warning("The task was ended by a user: stopping container %s", self.container_id[:12])
        await asyncio.to_thread(self._stop)

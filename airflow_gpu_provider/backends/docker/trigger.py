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
``refused`` at once, having logged and stopped nothing. The decision loop and ``on_kill`` are the job wing's
(``backends/jobs/trigger.py``). A user who ends the deferred task (mark failed or success, clear) ends its container
too: Airflow 3.3's triggerer calls ``on_kill`` for such an action (not on a triggerer restart, which only moves the
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

from airflow.triggers.base import TriggerEvent

from airflow_gpu_provider.backends.jobs.trigger import JobTrigger, Look

_ENDED = ("exited", "dead")
ENGINE_OPTIONS = ("docker_url", "api_version", "timeout")  # what a trigger takes to reach the engine, nothing more
DRAIN_S = 10.0  # how long the output may take to be read to its end once the container has ended


def _settle(future: asyncio.Future[bool], value: bool) -> None:
    if not future.done():
        future.set_result(value)


class DockerContainerTrigger(JobTrigger):
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

    noun = "container"

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
        super().__init__(container_id, engine, poll_interval, deadline, state=state)
        self.stop_timeout = stop_timeout
        self._stream: Any = None  # the container's output, while a thread reads it
        self._client_now: Any = None  # the client of the looks
        self._followed: asyncio.Future[bool] | None = None  # the output read to its end (True), or not

    def arguments(self) -> dict[str, Any]:
        """The container, the engine and the grace (the names a stored row of an earlier release has)."""
        return {
            "container_id": self.job_id,
            "engine": self.where,
            "poll_interval": self.poll_interval,
            "deadline": self.deadline,
            "state": self.state,
            "stop_timeout": self.stop_timeout,
        }

    def _client(self) -> Any:
        from airflow_gpu_provider.backends.docker.client import connect
        from airflow_gpu_provider.backends.docker.options import DockerOptions

        reach = {name: self.where[name] for name in ENGINE_OPTIONS if self.where.get(name) is not None}
        return connect(DockerOptions.parse(reach), login=False)

    def event(self, status: str, **details: Any) -> TriggerEvent:
        """The event, naming the container as events of earlier releases did."""
        return super().event(status, container_id=self.job_id, **details)

    def _log_output(self, loop: asyncio.AbstractEventLoop, done: asyncio.Future[bool]) -> None:
        """Log the container's output, all of it from its start, as it comes (a thread's); ``done``: read to its end.

        With a client of its own: the stream holds its connection until the container ends.
        """
        from airflow_gpu_provider.backends.docker.lifecycle import log_lines

        whole, client = False, None
        try:
            client = self._client()
            self._stream = client.logs(self.job_id, stdout=True, stderr=True, stream=True, follow=True)
            chunks = ((chunk, None) for chunk in self._stream)  # as lifecycle.output reads them
            log_lines(chunks, self.log)  # type: ignore[arg-type]  # Airflow's logger takes what logging's does
            whole = True
        except Exception as exc:  # noqa: BLE001 - the resume logs what was not logged here
            self.log.warning("Stopped reading the output of container %s: %s", self.job_id[:12], exc)
        finally:
            if client is not None:
                client.close()
            with contextlib.suppress(RuntimeError):  # the loop has closed: nobody waits for it
                loop.call_soon_threadsafe(_settle, done, whole)

    async def details(self, status: str) -> dict[str, Any]:
        """What the event says of the output: all of it ``logged``, logged ``until`` a time, or nothing known."""
        followed = self._followed
        assert followed is not None  # run() made it
        if status == "exited":  # the rest is still being read
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(followed), DRAIN_S)
        if followed.done():
            return {"output": {"logged": True} if followed.result() else {}}
        return {"output": {"until": time.time()}}

    def look(self) -> Look:
        """The container's state (in a thread: docker-py and its import block)."""
        from docker.errors import NotFound

        try:
            state = dict(self._client_now.inspect_container(self.job_id)["State"])
        except NotFound:
            return Look("missing")
        if state.get("Status") in _ENDED:
            return Look(
                "exited", details={"exit_code": state.get("ExitCode"), "oom_killed": bool(state.get("OOMKilled"))}
            )
        return Look()

    def _ours(self, client: Any) -> bool:
        """Whether the container is this task instance's (:func:`.durable.belongs`); a gone one is (it fires)."""
        from docker.errors import APIError

        from airflow_gpu_provider.backends.docker.durable import belongs

        ti = self.task_instance  # set by the triggerer; not by dag.test(), which runs the trigger in the task itself
        identity = None if ti is None else {key: getattr(ti, key, None) for key in ("dag_id", "task_id", "run_id")}
        if identity is not None:
            identity["map_index"] = getattr(ti, "map_index", -1)
        try:
            return belongs(client.inspect_container(self.job_id), identity)
        except APIError as err:
            return getattr(err, "status_code", None) == 404

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """Log the container's output as it comes; look at the container every ``poll_interval`` s until it ends."""
        self._client_now = await asyncio.to_thread(self._client)
        if not await asyncio.to_thread(self._ours, self._client_now):
            self._client_now.close()
            self.log.error("Container %s is not this task's: nothing is watched", self.job_id[:12])
            yield self.event("refused", output={})
            return
        self.log.info("Its output follows as it is written")
        loop = asyncio.get_running_loop()
        self._followed = loop.create_future()
        reader = contextvars.copy_context()  # the trigger's: the triggerer routes its log lines to the task's log
        threading.Thread(
            target=reader.run, args=(self._log_output, loop, self._followed), name="docker-output", daemon=True
        ).start()
        try:
            async for event in super().run():
                yield event
        finally:
            if self._stream is not None:
                await asyncio.to_thread(self._stream.close)  # the reading thread ends (a trigger moved elsewhere)
            self._client_now.close()

    def stop(self) -> None:
        """Stop and remove the container (SIGTERM, SIGKILL after ``stop_timeout``; in a thread)."""
        from airflow_gpu_provider.backends.docker.lifecycle import stop

        client = self._client()
        try:
            if self._ours(client):
                stop(client, self.job_id, self.stop_timeout)
        finally:
            client.close()

"""Every Kubernetes API call the code issues in the test session, as RBAC sees it: ``(verb, group, resource)``.

By principal: the ``worker`` (the task's process: KubernetesPodOperator, the Indexed Job's run, the companions) and
the ``triggerer`` (the cncf triggers of a deferred task, run by ``cluster_answers.fire`` inside :func:`as_principal`).

Every generated method of the kubernetes client (``CoreV1Api.create_namespaced_pod``, ``ResourceV1Api...``) ends in
one method, ``ApiClient.call_api(path, method, ...)``, with the path's template (``/api/v1/namespaces/{namespace}/
pods/{name}/log``) and the HTTP method. This plugin wraps that method for the whole session: each call is recorded,
mapped onto RBAC's verb, API group and resource (``pods/log``), then passed on, to the network (a closed port, or a
test's own server), or to the answer a test gives for that very call (:func:`answering`, used by
``cluster_answers.Cluster``). The recording is of calls the code really makes through the client, whoever answers.

``tests/backends/kubernetes/test_rbac.py`` checks the shipped Role against what was recorded.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import json
import os
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NamedTuple

from kubernetes.client import ApiClient

#: The answer a test gives to the call being made (set around one generated method; None: the call goes out)
_ANSWER: contextvars.ContextVar[Callable[[], Any] | None] = contextvars.ContextVar("answer", default=None)
#: RBAC authorizes a WebSocket GET on these (the client's exec) as ``get``, and from Kubernetes 1.35 as ``create`` too
CONNECT = frozenset({"exec", "attach", "portforward"})
#: Where a child pytest writes what it recorded (test_rbac.py runs the Kubernetes tests a session left out)
OUTPUT = "AIRFLOW_GPU_TEST_API_CALLS"


class Call(NamedTuple):
    """One permission a call needs: ``("create", "", "pods")``, ``("get", "", "pods/log")``."""

    verb: str
    group: str
    resource: str


PRINCIPALS = ("worker", "triggerer")
CALLS: dict[str, set[Call]] = {principal: set() for principal in PRINCIPALS}
_PRINCIPAL: contextvars.ContextVar[str] = contextvars.ContextVar("principal", default="worker")
_ORIGINAL = ApiClient.call_api


@contextlib.contextmanager
def as_principal(principal: str) -> Iterator[None]:
    """Calls made inside (the context's copies too: an ``asyncio.run``) are ``principal``'s."""
    token = _PRINCIPAL.set(principal)
    try:
        yield
    finally:
        _PRINCIPAL.reset(token)


def permissions(method: str, path: str, query: Iterable[tuple[str, Any]] | None = None) -> set[Call]:
    """What RBAC asks of a request: ``GET /api/v1/namespaces/{namespace}/pods`` with ``watch`` -> ``watch pods``."""
    parts = [part for part in path.split("?", maxsplit=1)[0].split("/") if part]
    group, rest = ("", parts[2:]) if parts[0] == "api" else (parts[1], parts[3:])
    if len(rest) >= 3 and rest[0] == "namespaces":
        rest = rest[2:]  # a namespaced resource: /namespaces/{namespace}/<resource>[/{name}[/<subresource>]]
    resource, named = rest[0], len(rest) > 1
    if len(rest) > 2:
        resource = f"{resource}/{rest[2]}"
    watch = any(key == "watch" and value for key, value in query or ())
    verb = {
        "GET": ("get" if named else "watch" if watch else "list"),
        "POST": "create",
        "PUT": "update",
        "PATCH": "patch",
        "DELETE": ("delete" if named else "deletecollection"),
    }[method.upper()]
    verbs = {"get", "create"} if method.upper() == "GET" and resource.rpartition("/")[2] in CONNECT else {verb}
    return {Call(one, group, resource) for one in verbs}


def _call_api(self: ApiClient, resource_path: str, method: str, path_params: Any = None, query_params: Any = None,
              *args: Any, **kwargs: Any) -> Any:  # fmt: skip
    CALLS[_PRINCIPAL.get()].update(permissions(method, resource_path, query_params))
    answer = _ANSWER.get()
    if answer is not None:
        token = _ANSWER.set(None)
        try:
            return answer()
        finally:
            _ANSWER.reset(token)
    return _ORIGINAL(self, resource_path, method, path_params, query_params, *args, **kwargs)


def answering(generated: Callable[..., Any], answer: Callable[..., Any]) -> Callable[..., Any]:
    """``generated`` (a client method, as its class defines it) answered by ``answer`` (same arguments).

    The generated method still runs: it checks its arguments, builds the path and calls ``call_api``, which records
    the call and returns the answer instead of sending it.
    """

    @functools.wraps(generated)
    def method(api: Any, *args: Any, **kwargs: Any) -> Any:
        token = _ANSWER.set(lambda: answer(api, *args, **kwargs))
        try:
            return generated(api, *args, **kwargs)
        finally:
            _ANSWER.reset(token)

    return method


def call(generated: Callable[..., Any], api: Any, *args: Any, answer: Any = None, **kwargs: Any) -> Any:
    """Make the call ``generated(api, *args, **kwargs)`` with ``answer`` as its answer (for cncf code a test replaces)."""
    return answering(generated, lambda *_, **__: answer)(api, *args, **kwargs)


def pytest_configure(config: Any) -> None:
    """Wrap ``call_api`` for the session."""
    ApiClient.call_api = _call_api  # type: ignore[method-assign]


def pytest_sessionfinish(session: Any) -> None:
    """In a child pytest of test_rbac.py: write what was recorded."""
    path = os.environ.get(OUTPUT)
    if path:
        with open(path, "w") as out:
            json.dump({principal: sorted(calls) for principal, calls in CALLS.items()}, out)

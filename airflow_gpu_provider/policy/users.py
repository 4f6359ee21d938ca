"""Who a Docker task's container runs as, and which groups it joins: numbers resolved on this host.

Rules D2 and D4 of docs/security.md. The engine resolves a user or group *name* in the container's own ``/etc/passwd``
and ``/etc/group``, which the DAG author's image writes: ``alice`` may be uid 0 there, ``video`` any gid, and a uid
without a group gets gid 0. So the engine is handed numbers only, ``uid:gid`` and numeric groups, each name resolved
here, on the host that checks (the DAG processor at parse, the worker when the task starts), in its own passwd and group
databases: the admin's ``[gpu_policy] allowed_users`` and ``allowed_groups`` mean what they mean on the worker. A user
entry without a group stands for that user with its primary group on this host; any other group must be listed with it
(``uid:gid``). The device groups of AMD and Intel GPUs (``video``, ``render``) are this host's gids, as the device
nodes' owners are.
"""

from __future__ import annotations

import contextlib
import grp
import os
import pwd
from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

DEVICE_GROUPS: tuple[str, ...] = ("video", "render")
T = TypeVar("T")
USERS_ACCEPTED = "a user of the worker host ('ml' or 1000, with its primary group) or 'uid:gid' ('1000:1000')"


class UnknownNameError(ValueError):
    """A user or group that this host's databases do not know, or a uid whose group cannot be told."""


def worker_ids() -> tuple[int, int]:
    """The worker's own ``(uid, gid)``: what a container runs as unless the admin lists another."""
    return os.geteuid(), os.getegid()


def group_id(value: str | int) -> int:
    """A group as a gid of this host: a number as it is, a name from this host's group database."""
    text = str(value).strip()
    gid = number(text)
    if gid is not None:
        return gid
    try:
        return grp.getgrnam(text).gr_gid
    except KeyError:
        raise UnknownNameError(f"{text!r} is not a group of this host") from None


def user_ids(value: str | int) -> tuple[int, int]:
    """``name``, ``uid``, ``uid:gid`` or ``name:group`` as ``(uid, gid)`` of this host.

    :raises UnknownNameError: for a name this host does not know, or a uid without a group and no passwd entry
    """
    user, colon, group = str(value).strip().partition(":")
    entry: pwd.struct_passwd | None = None
    uid = number(user)
    if uid is not None:
        with contextlib.suppress(KeyError):
            entry = pwd.getpwuid(uid)
    else:
        try:
            entry = pwd.getpwnam(user)
        except KeyError:
            raise UnknownNameError(f"{user!r} is not a user of this host") from None
        uid = entry.pw_uid
    if colon:
        return uid, group_id(group)
    if entry is None:
        raise UnknownNameError(f"uid {uid} has no entry on this host, so no group: give it as uid:gid")
    return uid, entry.pw_gid


def _resolved(entries: Iterable[str], resolve: Callable[[str], T]) -> list[T]:
    """Each entry resolved on this host, in order, once; an entry this host does not know allows nothing here."""
    found: dict[T, None] = {}
    for entry in entries:
        with contextlib.suppress(UnknownNameError):
            found[resolve(entry)] = None
    return list(found)


def user_allowed(ids: tuple[int, int], allowed: Iterable[str]) -> bool:
    """Whether ``(uid, gid)`` is the worker's own or one of the admin's entries, as this host resolves them."""
    return ids == worker_ids() or ids in _resolved(allowed, user_ids)


def allowed_gids(allowed: Iterable[str]) -> set[int]:
    """The gids a container may join: the admin's groups, and this host's device groups (``video``, ``render``)."""
    return set(_resolved([*allowed, *DEVICE_GROUPS], group_id))


def container_user(value: str | int | None, allowed: Iterable[str]) -> str:
    """The ``uid:gid`` a container runs as (the worker's own for ``None``).

    :raises UnknownNameError: a name this host does not know
    :raises PermissionError: a user (or a group of it) that ``[gpu_policy] allowed_users`` does not list
    """
    ids = worker_ids() if value is None else user_ids(value)
    if not user_allowed(ids, allowed):
        raise PermissionError(f"{ids[0]}:{ids[1]} is not the worker's own user nor one the deployment lists")
    return f"{ids[0]}:{ids[1]}"


def container_groups(values: Sequence[str | int], allowed: Iterable[str]) -> list[str]:
    """Supplementary groups as this host's gids (strings, as the engine takes them), each one allowed.

    :raises UnknownNameError: a name this host does not know
    :raises PermissionError: a group that ``[gpu_policy] allowed_groups`` does not list (nor a device group)
    """
    gids, permitted = [group_id(value) for value in values], allowed_gids(allowed)
    refused = [gid for gid in gids if gid not in permitted]
    if refused:
        raise PermissionError(f"gid {refused[0]} is not a group the deployment lists")
    return [str(gid) for gid in dict.fromkeys(gids)]


def device_gids() -> list[str]:
    """The ``video`` and ``render`` gids of this host (those it has), for AMD and Intel GPU containers."""
    return [str(gid) for gid in _resolved(DEVICE_GROUPS, group_id)]


def number(text: str) -> int | None:
    """A uid or gid written in ASCII digits, as the engine reads a number; ``None`` for anything else (a name).

    ``str.isdigit`` is not enough: ``'٠'`` is a digit to Python (``int`` reads it as 0) but a name to the engine
    (Go's ``strconv.Atoi``), which it resolves in the image's own databases.
    """
    return int(text) if text.isascii() and text.isdigit() else None


def numeric_user(user: str) -> tuple[int, int] | None:
    """``(uid, gid)`` of a create call's ``user`` when it is ``uid:gid`` in numbers; ``None`` for anything else."""
    uid, colon, gid = user.partition(":")
    ids = number(uid), number(gid)
    return (ids[0], ids[1]) if colon and ids[0] is not None and ids[1] is not None else None

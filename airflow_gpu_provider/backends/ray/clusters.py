"""Which Ray clusters a task may reach, and which of them without token auth: the admin's allow-list (rule R1).

A Ray cluster runs whatever its token's holder submits, as its nodes' user: the provider sends a task (and the
token) only to the deployment's own cluster (the ``ray_default`` connection's address) or to one the admin lists in
``allowed_clusters`` as ``ray=ADDRESS``. A cluster that runs jobs for anyone who reaches it (no token auth) is used
only where the admin says so, ``ray-unauthenticated=ADDRESS``. Checked at parse (a literal ``address``), on the
worker and in the triggerer, before any request.
"""

from __future__ import annotations

from dataclasses import dataclass

from airflow_gpu_provider.policy import PolicyError

OPTION = "allowed_clusters"
#: the kinds of ``allowed_clusters`` entries this backend reads (``docker=...`` and others are another's)
RAY, UNAUTHENTICATED = "ray", "ray-unauthenticated"
ACCEPTED = "KIND=ADDRESS, comma-separated: ray=http://ray-head:8265, ray-unauthenticated=http://lab-head:8265"


def address_key(address: str) -> str:
    """An address as the allow-list compares it: the scheme and host in lower case, no trailing ``/``."""
    scheme, colon, rest = address.strip().partition("://")
    if not colon:
        return address.strip().rstrip("/").lower()
    host, slash, path = rest.partition("/")
    return f"{scheme.lower()}://{host.lower()}{slash}{path}".rstrip("/")


@dataclass(frozen=True)
class RayClusters:
    """The Ray clusters the admin lists: those a task may reach, and those it may reach without token auth."""

    listed: frozenset[str] = frozenset()
    unauthenticated: frozenset[str] = frozenset()

    @classmethod
    def of(cls, text: str) -> RayClusters:
        """Parse ``allowed_clusters``; entries of other kinds are left to their backends."""
        listed: set[str] = set()
        unauthenticated: set[str] = set()
        for entry in filter(None, (part.strip() for part in text.split(","))):
            kind, equals, address = (piece.strip() for piece in entry.partition("="))
            if kind.lower() not in (RAY, UNAUTHENTICATED):
                continue
            if not equals or "://" not in address:
                raise ValueError(f"[gpu] {OPTION}: {entry!r} is not KIND=ADDRESS ({ACCEPTED})")
            listed.add(address_key(address))
            if kind.lower() == UNAUTHENTICATED:
                unauthenticated.add(address_key(address))
        return cls(frozenset(listed), frozenset(unauthenticated))

    @classmethod
    def current(cls) -> RayClusters:
        """The list as this process reads it: at parse the DAG processor's, then the worker's, the triggerer's.

        TODO(lead, at the merge of i34-authz): read the ``ray`` and ``ray-unauthenticated`` entries through the
        shared ``[gpu_policy] allowed_clusters`` reader instead of ``[gpu] allowed_clusters`` here.
        """
        from airflow_gpu_provider.config import airflow_setting

        return cls.of(airflow_setting("gpu", OPTION, fallback="") or "")

    def check(self, owner: str, field: str, address: str, default: str | None) -> None:
        """Refuse ``address`` unless it is the deployment's own cluster (``default``) or listed.

        :raises PolicyError: naming the address and the option
        """
        key = address_key(address)
        if key in self.listed or (default is not None and key == address_key(default)):
            return
        allowed = ", ".join(sorted({*self.listed, *([address_key(default)] if default else [])})) or "none"
        raise PolicyError(owner, field, address, "a Ray cluster the deployment does not list", option=OPTION,
                          allow=f"{allowed} (entries ray=ADDRESS)")  # fmt: skip

    def without_token(self, address: str) -> bool:
        """Whether the admin lets tasks use ``address`` without token auth (``ray-unauthenticated=``)."""
        return address_key(address) in self.unauthenticated

"""Which Ray clusters a task may reach, and which of them without token auth: the admin's allow-list (rule R1).

A Ray cluster runs whatever its token's holder submits, as its nodes' user: the provider sends a task (and the
token) only to the deployment's own cluster (the ``ray_default`` connection's address) or to one the admin lists in
``[gpu_policy] allowed_clusters`` as ``ray=ADDRESS``. A cluster that runs jobs for anyone who reaches it (no token
auth) is used only where the admin says so, ``ray-unauthenticated=ADDRESS``. Both kinds are entries of the one
policy reader (``config/policy.py`` ``CLUSTER_KINDS``). Checked at parse (a literal ``address``), on the worker, in
the triggerer and in the listener, before any request.
"""

from __future__ import annotations

from dataclasses import dataclass

from airflow_gpu_provider.config.policy import SECTION
from airflow_gpu_provider.policy import Policy, PolicyError

OPTION = "allowed_clusters"
#: the kinds of ``allowed_clusters`` entries this backend reads (``docker=...`` and others are another's)
RAY, UNAUTHENTICATED = "ray", "ray-unauthenticated"


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
    def of(cls, policy: Policy) -> RayClusters:
        """The ``ray`` and ``ray-unauthenticated`` entries of a policy's ``allowed_clusters``.

        :raises ValueError: an entry whose address is no URL
        """
        for kind in (RAY, UNAUTHENTICATED):
            for address in policy.clusters[kind]:
                if "://" not in address:
                    raise ValueError(f"[{SECTION}] {OPTION}: {kind}={address} is not {kind}=URL (http://head:8265)")
        unauthenticated = frozenset(map(address_key, policy.clusters[UNAUTHENTICATED]))
        return cls(frozenset(map(address_key, policy.clusters[RAY])) | unauthenticated, unauthenticated)

    @classmethod
    def current(cls) -> RayClusters:
        """The list as this process reads it: at parse the DAG processor's, then the worker's, the triggerer's."""
        return cls.of(Policy.current())

    def check(self, owner: str, field: str, address: str, default: str | None) -> None:
        """Refuse ``address`` unless it is the deployment's own cluster (``default``) or listed.

        :raises PolicyError: naming the address and the option
        """
        key = address_key(address)
        if key in self.listed or (default is not None and key == address_key(default)):
            return
        own = [f"{address_key(default)} (ray_default's)"] if default else []
        allowed = ", ".join([*own, *(f"ray={listed}" for listed in sorted(self.listed))]) or "none"
        raise PolicyError(owner, field, address, "a Ray cluster the deployment does not list", option=OPTION,
                          allow=allowed)  # fmt: skip

    def without_token(self, address: str) -> bool:
        """Whether the admin lets tasks use ``address`` without token auth (``ray-unauthenticated=``)."""
        return address_key(address) in self.unauthenticated

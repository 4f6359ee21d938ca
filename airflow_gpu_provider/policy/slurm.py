"""What a Slurm job may name: its cluster (a connection) and the partition, account, QoS and reservation listed.

docs/slurm.md: Slurm's associations bound what a user may submit, but every task of the deployment
submits as the worker's one user, whose associations are the union of every team's. So a task names a partition,
account, QoS or reservation only where ``[gpu_policy] allowed_objects`` lists it (``partition=gpu``, ``account=ml``,
``qos=*``), and a cluster other than ``slurm_default`` only where ``[gpu_policy] allowed_clusters`` lists its
connection (``slurm=slurm_team_a``); a job that names none gets the cluster's defaults. Checked at DAG parse and
again on the worker, with its own configuration, before the job is submitted.
"""

from __future__ import annotations

from collections.abc import Mapping

from airflow_gpu_provider.policy import Policy, PolicyError

OBJECTS, CLUSTERS = "allowed_objects", "allowed_clusters"
DEFAULT_CONN_ID = "slurm_default"


def unlisted(names: Mapping[str, str], policy: Policy) -> dict[str, str]:
    """The names a job gives (kind -> name) that the allow-list does not hold; ``{}`` when none."""
    found = {}
    for kind, name in names.items():
        listed = policy.objects.get(kind, frozenset())
        if name not in listed and "*" not in listed:
            found[kind] = name
    return found


def check_cluster(owner: str, conn_id: str, policy: Policy) -> None:
    """Refuse (:class:`PolicyError`) a connection other than the default that ``allowed_clusters`` does not list."""
    listed = policy.clusters.get("slurm", ())
    if conn_id != DEFAULT_CONN_ID and conn_id not in listed:
        allowed = ", ".join((f"{DEFAULT_CONN_ID} (the default)", *(f"slurm={name}" for name in listed)))
        raise PolicyError(owner, "backend_options['slurm_conn_id']", conn_id, "a cluster the deployment does not list",
                          option=CLUSTERS, allow=allowed)  # fmt: skip


def check_names(owner: str, names: Mapping[str, str], policy: Policy) -> None:
    """Refuse (:class:`PolicyError`) a job that names what the allow-list does not hold."""
    found = unlisted(names, policy)
    if found:
        kind, name = next(iter(found.items()))
        listed = ", ".join(f"{kind}={n}" for n in sorted(policy.objects.get(kind, ()))) or f"no {kind}"
        raise PolicyError(
            owner,
            f"backend_options[{kind!r}]",
            name,
            f"{OBJECTS} lists {listed}, and the worker's one Slurm user may reach more than this task should",
            option=OBJECTS,
            allow=f"a {kind}={name} entry (the deployment's admin adds one), or no {kind} (the cluster's default)",
        )

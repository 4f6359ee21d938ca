"""What a Slurm job may name of its cluster: the partition, account, QoS and reservation the admin lists.

Rule S1 of docs/security.md: Slurm's associations bound what a user may submit, but every task of the deployment
submits as the worker's one user, whose associations are the union of every team's. So a task names a partition,
account, QoS or reservation only where ``[gpu] allowed_kubernetes_objects`` lists it (``partition=gpu``,
``account=ml``, ``qos=*``); a job that names none gets the cluster's defaults. Checked at DAG parse and again on the
worker, with its own configuration, before the job is submitted.
"""

from __future__ import annotations

from collections.abc import Mapping

from airflow_gpu_provider.policy import Policy, PolicyError

OPTION = "allowed_kubernetes_objects"


def unlisted(names: Mapping[str, str], policy: Policy) -> dict[str, str]:
    """The names a job gives (kind -> name) that the allow-list does not hold; ``{}`` when none."""
    found = {}
    for kind, name in names.items():
        listed = policy.kubernetes.get(kind, frozenset())
        if name not in listed and "*" not in listed:
            found[kind] = name
    return found


def check_names(owner: str, names: Mapping[str, str], policy: Policy) -> None:
    """Refuse (:class:`PolicyError`) a job that names what the allow-list does not hold."""
    found = unlisted(names, policy)
    if found:
        kind, name = next(iter(found.items()))
        listed = ", ".join(f"{kind}={n}" for n in sorted(policy.kubernetes.get(kind, ()))) or f"no {kind}"
        raise PolicyError(
            owner,
            f"backend_options[{kind!r}]",
            name,
            f"[gpu] {OPTION} lists {listed}, and the worker's one Slurm user may reach more than this task should",
            option=OPTION,
            allow=f"a {kind}={name} entry (the deployment's admin adds one), or no {kind} (the cluster's default)",
        )

"""Where a pod may run: the GPU toleration, and the merge of the provider's scheduling fields with the user's.

Merge rules (documented in ``docs/kubernetes-admin.md``):

- nodeSelector: pod template, provider-derived and ``node_selector`` keys are united; one key with two different
  values is an error, because no node can satisfy both;
- tolerations: the GPU toleration (unless ``gpu_toleration=False``), then the template's, then ``tolerations``,
  with exact duplicates dropped;
- affinity: ``affinity`` replaces the template's; the provider's accelerator expression is then added to *every*
  required node-selector term (terms are ORed, expressions within one ANDed), so it holds whichever term matches;
  a fallback list of models gives each term one copy per model (a node of any listed model), and preferred terms
  weighted in the list's order (the first model most); a ``kubernetes.io/hostname NotIn`` the nodes where an earlier
  try failed because of the infrastructure is ANDed into every required term too (:func:`avoiding_nodes`).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from airflow_gpu_provider.backends.pods.node_labels import accelerator_requirements, node_selector, preferred_terms
from airflow_gpu_provider.backends.pods.options import PodOptions
from airflow_gpu_provider.settings import ResourceSettings


def gpu_toleration(resource: str) -> dict[str, str]:
    """Tolerate the ``<resource>:NoSchedule`` taint that GPU node pools carry (GKE and the GPU Operator set it)."""
    return {"key": resource, "operator": "Exists", "effect": "NoSchedule"}


@dataclass(frozen=True)
class Placement:
    """The pod's scheduling fields, merged."""

    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: list[dict[str, Any]] = field(default_factory=list)
    affinity: dict[str, Any] = field(default_factory=dict)


def _dedupe(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    result: list[dict[str, Any]] = []
    for item in items:
        if item not in result:
            result.append(item)
    return result


def add_required_expressions(affinity: Mapping[str, Any], alternatives: list[list[dict[str, Any]]]) -> dict[str, Any]:
    """AND one of ``alternatives`` (lists of expressions, ORed) into every required node-selector term (a copy)."""
    result = copy.deepcopy(dict(affinity))
    if not alternatives:
        return result
    node = result.setdefault("nodeAffinity", {})
    required = node.setdefault("requiredDuringSchedulingIgnoredDuringExecution", {})
    terms = required.get("nodeSelectorTerms") or [{}]
    required["nodeSelectorTerms"] = [
        {**term, "matchExpressions": [*copy.deepcopy(term.get("matchExpressions") or []), *copy.deepcopy(expressions)]}
        for term in terms
        for expressions in alternatives
    ]
    return result


HOSTNAME_LABEL = "kubernetes.io/hostname"


def avoiding_nodes(affinity: Mapping[str, Any], nodes: tuple[str, ...]) -> dict[str, Any]:
    """``affinity`` with a required ``NotIn`` on the nodes' host names: a try after an infrastructure failure there."""
    if not nodes:
        return dict(affinity)
    return add_required_expressions(affinity, [[{"key": HOSTNAME_LABEL, "operator": "NotIn", "values": list(nodes)}]])


def add_preferred_terms(affinity: dict[str, Any], preferred: list[dict[str, Any]]) -> dict[str, Any]:
    """Append the fallback list's weighted preferences to the affinity's preferred node terms (in place)."""
    if preferred:
        node = affinity.setdefault("nodeAffinity", {})
        node.setdefault("preferredDuringSchedulingIgnoredDuringExecution", []).extend(preferred)
    return affinity


def placement(
    resources: ResourceSettings,
    toleration_key: str | None,
    options: PodOptions,
    template_spec: Mapping[str, Any] | None = None,
) -> Placement:
    """Merge the provider's scheduling fields with the pod template's and the user's (rules in the module doc)."""
    template_spec = template_spec or {}
    selector, alternatives = node_selector(
        resources,
        options.label_scheme,
        options.accelerator_labels,
        template=template_spec.get("nodeSelector") or {},
        user=options.node_selector or {},
    )
    own = [gpu_toleration(toleration_key)] if options.gpu_toleration and toleration_key else []
    template_tolerations = [dict(t) for t in template_spec.get("tolerations") or []]
    merged_tolerations = _dedupe([*own, *template_tolerations, *(dict(t) for t in options.tolerations)])
    affinity = options.affinity if options.affinity is not None else template_spec.get("affinity") or {}
    required = add_required_expressions(affinity, alternatives)
    preferred = preferred_terms(accelerator_requirements(resources, options.label_scheme, options.accelerator_labels))
    return Placement(selector, merged_tolerations, add_preferred_terms(required, preferred))

"""KubernetesExecutor: the worker pod's ``pod_override``, made by the Kubernetes backend's own mapping modules.

The pod asks for what the Kubernetes backend's pod asks for: the vendor's GPU resource (limits = requests, MIG
slices), cpu and memory, the accelerator's node labels, the GPU toleration, ``/dev/shm``, the restricted security
context (:mod:`~airflow_gpu_provider.backends.pods.resources`, ``.scheduling``, ``.container``). The executor
merges it into its worker pod template: its first container into the template's ``base`` container, whose
``resources`` and ``securityContext`` it *replaces*, and the spec's ``nodeSelector`` and ``tolerations`` too. So the
template (``[kubernetes_executor] pod_template_file``, or the task's ``executor_config["pod_template_file"]``), when
readable where the DAG is parsed, is merged here first, with the Kubernetes backend's template rules.

A task's own ``pod_override`` is merged, not replaced: what both set must agree, or the DAG fails to parse with an
error that names both values. The kubernetes client is imported only here, for tasks that go to KubernetesExecutor.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from airflow_gpu_provider.backends.executor.options import CLAIM_TEMPLATE_OPTION
from airflow_gpu_provider.backends.pods import dra, resources, scheduling, security
from airflow_gpu_provider.backends.pods.options import DNS_SUBDOMAIN, PodOptions
from airflow_gpu_provider.backends.pods.security import overlay
from airflow_gpu_provider.config import airflow_setting
from airflow_gpu_provider.exceptions import InvalidSettingError
from airflow_gpu_provider.policy import Policy, PolicyError
from airflow_gpu_provider.policy.pods import has_nvidia_device, isolated, refused, refused_names, unlisted, violations
from airflow_gpu_provider.settings import ALL_GPUS, ResourceSettings
from airflow_gpu_provider.task.labels import MANAGED_BY, kubernetes_label

FIELD = "executor_config['pod_override']"
_FROM_PLACEMENT = ("tolerations", "affinity")  # merged with the user's by the scheduling rules, not key by key


def executor_config(
    owner: str, wanted: ResourceSettings, pod_options: Mapping[str, Any], given: Mapping[str, Any] | None
) -> dict[str, Any]:
    """The task's ``executor_config`` with the GPU ``pod_override`` (a ``V1Pod``) merged into its own."""
    if wanted.gpu_count == ALL_GPUS:
        raise InvalidSettingError(
            owner, "gpu_count", ALL_GPUS, "a KubernetesExecutor pod asks for a number of GPUs", "an integer"
        )
    options = _options(owner, pod_options)
    given = dict(given or {})
    user = to_dict(given.get("pod_override")) or {}
    template = worker_template(owner, given.get("pod_template_file"))
    template_user = ((template.get("spec") or {}).get("securityContext") or {}).get("runAsUser")
    if "run_as_user" not in pod_options and isinstance(template_user, int) and template_user > 0:
        options = dataclasses.replace(options, run_as_user=template_user)  # the worker image's user (airflow: 50000)
    claim = _claim_template(owner, wanted, pod_options, user, template)
    provider = provider_pod(wanted, options, template, user.get("spec") or {}, claim_template=claim)
    merged = check_pod(
        owner, merge(provider, user, owner), given.get("pod_template_file"), template, options.pod_security
    )
    return {**given, "pod_override": to_pod(merged)}


def check_placed(owner: str, pod_options: Mapping[str, Any], given: Mapping[str, Any]) -> dict[str, Any]:
    """A ``pod_override`` marked as placed is judged again (the mark is in the task's hands): the final check."""
    options = _options(owner, pod_options)
    own = given.get("pod_template_file")
    merged = to_dict(given.get("pod_override")) or {}
    checked = check_pod(owner, merged, own, worker_template(owner, own), options.pod_security)
    return {**given, "pod_override": to_pod(checked)}


def _options(owner: str, pod_options: Mapping[str, Any]) -> PodOptions:
    """``backend_options['kubernetes']``, parsed, and its level one ``[gpu_policy] min_pod_security`` allows."""
    try:
        options = PodOptions.parse({k: v for k, v in pod_options.items() if k != CLAIM_TEMPLATE_OPTION})
        options.permitted(owner)
    except InvalidSettingError as err:
        field = err.field.replace("backend_options[", "backend_options['kubernetes'][", 1)
        renamed = type(err).__new__(type(err))  # a PolicyError stays one, with the [gpu] option it names
        renamed.__dict__.update(vars(err))
        InvalidSettingError.__init__(renamed, owner, field, err.value, err.reason, err.accepted)
        raise renamed from None
    return options


def check_pod(
    owner: str, merged: dict[str, Any], own: str | None, template: Mapping[str, Any], level: str
) -> dict[str, Any]:
    """The final check of a ``pod_override`` (``policy.pods.final``, at DAG parse): ``merged`` with device isolation.

    Rule P1: the ``pod_override`` as merged, and the task's own worker template, meet ``level``. Rule P3: both name
    only what ``[gpu_policy] allowed_objects`` lists, or ``[kubernetes_executor] namespace``. Rule P4: every
    container without an NVIDIA device gets ``NVIDIA_VISIBLE_DEVICES=void``: the ``pod_override``'s, and those of
    the worker template (when readable here) through entries the executor merges into them (:func:`_reaching`).

    The executor merges the ``pod_override`` into the worker template in the scheduler; the provider never sees that
    pod. It judges what the task brings: the merged ``pod_override`` (every container, init and ephemeral container,
    volume, namespace, sysctl, annotation), and a template the task names in ``executor_config['pod_template_file']``
    (``own``) with the ``pod_override``'s security contexts over it, which must be readable here to be judged.
    ``[kubernetes_executor] pod_template_file`` is the deployment's own, not judged here (docs/security.md: Pod
    Security admission on the namespace is the platform team's).
    """
    choice = "backend_options={'kubernetes': {'pod_security': ...}}"
    merged = isolated(merged)
    found = violations(merged, level)
    if found:
        raise refused(owner, FIELD, found, level, choice=choice)
    allowed = _allowed()
    names = unlisted(merged, allowed)
    if names:
        raise refused_names(owner, FIELD, names)
    if own is not None and unlisted(template, allowed):
        raise refused_names(owner, "executor_config['pod_template_file']", unlisted(template, allowed))
    if own is not None and level != "privileged":
        if not Path(own).is_file():
            raise PolicyError(
                owner, "executor_config['pod_template_file']", own,
                "not readable where the DAG is parsed, so its pod cannot be checked against the task's "
                f"{level} pod security level", option="min_pod_security",
                allow=f"a worker template readable by the DAG processor, or {choice} where it allows 'privileged'",
            )  # fmt: skip
        found = violations(overlay(template, merged), level)
        if found:
            raise refused(owner, "executor_config['pod_template_file']", found, level, choice=choice)
    return isolated(_reaching(merged, template))


def _reaching(merged: dict[str, Any], template: Mapping[str, Any]) -> dict[str, Any]:
    """``merged`` with an entry for each container of the worker template it does not reach, for their isolation.

    (The executor merges containers by position and init containers by name, appending ``env``.)
    """
    spec, theirs = dict(merged.get("spec") or {}), template.get("spec") or {}
    containers, inits = list(spec.get("containers") or []), list(spec.get("initContainers") or [])
    named = {item.get("name") for item in inits if isinstance(item, Mapping)}
    for item in (theirs.get("containers") or [])[len(containers) :]:
        if isinstance(item, Mapping):
            containers.append({"name": item.get("name"), "resources": item.get("resources") or {}})
    for item in theirs.get("initContainers") or []:
        if isinstance(item, Mapping) and item.get("name") not in named and not has_nvidia_device(item):
            inits.append({"name": item.get("name")})
    spec.update(containers=containers, **({"initContainers": inits} if inits else {}))
    return {**merged, "spec": spec}


def _allowed() -> dict[str, frozenset[str]]:
    """What a worker pod may name (rule P3): the allow-list, and the executor's own namespace."""
    allowed = Policy.current().objects
    namespace = airflow_setting("kubernetes_executor", "namespace", fallback="default") or "default"
    return {**allowed, "namespace": allowed["namespace"] | {namespace}}


def _claim_template(
    owner: str, wanted: ResourceSettings, pod_options: Mapping[str, Any], user: Mapping[str, Any], template: Any
) -> str | None:
    """``dra_claim_template``, checked: a template name, for a GPU task, and no claims of the pod's own."""
    name = pod_options.get(CLAIM_TEMPLATE_OPTION)
    field = f"backend_options['kubernetes'][{CLAIM_TEMPLATE_OPTION!r}]"
    if name is None or not wanted.requests_gpus:
        return None
    if not isinstance(name, str) or not DNS_SUBDOMAIN.fullmatch(name):
        raise InvalidSettingError(owner, field, name, "not a ResourceClaimTemplate name", "a DNS subdomain name")
    for where, spec in ((FIELD, user.get("spec") or {}), ("the worker pod template", template.get("spec") or {})):
        if spec.get("resourceClaims"):
            raise InvalidSettingError(
                owner, FIELD if where == FIELD else field, {"spec": {"resourceClaims": spec["resourceClaims"]}},
                f"{where} holds resource claims, and {CLAIM_TEMPLATE_OPTION} gives the pod its own GPU claim",
                f"a pod_override without spec.resourceClaims, or no {CLAIM_TEMPLATE_OPTION}",
            )  # fmt: skip
    return name


def provider_pod(
    wanted: ResourceSettings,
    options: PodOptions,
    template: Mapping[str, Any],
    user_spec: Mapping[str, Any],
    *,
    claim_template: str | None = None,
) -> dict[str, Any]:
    """The GPU pod as an API dict: the Kubernetes backend's mapping, over the worker template's scheduling fields.

    :param claim_template: an admin's ResourceClaimTemplate: the GPUs are its claim's, not an extended resource's
    """
    template_spec = template.get("spec") or {}
    base = ((template_spec.get("containers") or [{}])[0]) or {}
    amounts = resources.container_resources(wanted)
    if claim_template is not None:  # the admin's template selects the devices (and their model)
        amounts = resources.without_accelerators(amounts)
        options = dataclasses.replace(options, label_scheme="none")
    for kind in ("requests", "limits"):  # the executor replaces the template's: keep what the task leaves unset
        kept = {k: v for k, v in ((base.get("resources") or {}).get(kind) or {}).items() if k not in amounts[kind]}
        amounts[kind] = {**kept, **amounts[kind]}
    restricted = options.pod_security == "restricted"
    overrides = {**(base.get("securityContext") or {}), **(options.container_security_context or {})}
    accelerator_key = resources.accelerator_resource(wanted)
    options = dataclasses.replace(
        options,
        tolerations=(*options.tolerations, *(user_spec.get("tolerations") or [])),
        affinity=user_spec.get("affinity") or options.affinity,
    )
    place = scheduling.placement(
        wanted, wanted.gpu_vendor.k8s_resource if accelerator_key else None, options, template_spec
    )
    volumes, mounts = resources.shm_volume(wanted)
    main: dict[str, Any] = {
        "name": "base",
        "resources": {kind: values for kind, values in amounts.items() if values},
        "securityContext": security.security_context(overrides, restricted=restricted, user=options.run_as_user),
    }
    if mounts:
        main["volumeMounts"] = mounts
    if claim_template is not None:
        main["resources"]["claims"] = dra.container_claims()
    spec: dict[str, Any] = {
        "containers": [main],
        "nodeSelector": place.node_selector,
        "tolerations": place.tolerations,
        "affinity": place.affinity,
        "securityContext": security.pod_security_context(restricted=restricted, user=options.run_as_user),
        "volumes": volumes,
        "priorityClassName": options.priority_class_name,
        "runtimeClassName": options.runtime_class_name,
        "serviceAccountName": options.service_account_name,
        "resourceClaims": dra.pod_claims(claim_template) if claim_template is not None else None,
    }
    metadata = {
        "labels": {**MANAGED_BY, **(options.labels or {})},
        "annotations": {kubernetes_label("resources"): wanted.describe(), **(options.annotations or {})},
    }
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": _pruned(spec)}


def merge(provider: Mapping[str, Any], user: Mapping[str, Any], owner: str, path: str = "") -> dict[str, Any]:
    """The user's pod with the provider's merged in; one field with two values is an error naming both."""
    merged = dict(user)
    for key, mine in provider.items():
        where = f"{path}.{key}" if path else key
        theirs = user.get(key)
        if theirs is None or theirs in ({}, []) or key in _FROM_PLACEMENT:
            merged[key] = mine
        elif key == "containers":  # the executor merges the first container into the template's "base"
            merged[key] = [merge(mine[0], theirs[0], owner, f"{where}[0]"), *theirs[1:]]
        elif isinstance(mine, Mapping) and isinstance(theirs, Mapping):
            merged[key] = merge(mine, theirs, owner, where)
        elif isinstance(mine, list) and isinstance(theirs, list):
            merged[key] = _merge_lists(mine, theirs, owner, where)
        elif mine != theirs:
            raise InvalidSettingError(
                owner,
                FIELD,
                {where: theirs},
                f"the pod_override sets {where}={theirs!r} but the task's resources and backend_options "
                f"need {where}={mine!r}",
                f"a pod_override without {where} (the provider sets it), or resources that agree with it",
            )
    return merged


def _merge_lists(mine: list[Any], theirs: list[Any], owner: str, where: str) -> list[Any]:
    """Named items (volumes, mounts, env) by name, conflicts checked; anything else: united without duplicates."""
    if all(isinstance(item, Mapping) and "name" in item for item in [*mine, *theirs]):
        by_name = {item["name"]: dict(item) for item in theirs}
        for item in mine:
            name = item["name"]
            by_name[name] = merge(item, by_name[name], owner, f"{where}[{name}]") if name in by_name else dict(item)
        return list(by_name.values())
    return [*theirs, *(item for item in mine if item not in theirs)]


def worker_template(owner: str, task_template: str | None) -> dict[str, Any]:
    """The executor's worker pod template as a dict, when readable here; ``{}`` otherwise."""
    path = task_template or airflow_setting("kubernetes_executor", "pod_template_file")
    if not path or not Path(path).is_file():
        return {}
    import yaml

    try:
        return dict(yaml.safe_load(Path(path).read_text()) or {})
    except (yaml.YAMLError, ValueError, TypeError) as err:
        raise InvalidSettingError(owner, "pod_template_file", path, f"not a pod YAML file: {err}", None) from None


def to_dict(pod: Any) -> dict[str, Any] | None:
    """A ``V1Pod`` (or an API dict) as an API dict."""
    if pod is None or isinstance(pod, Mapping):
        return None if pod is None else dict(pod)
    from kubernetes.client import ApiClient

    return ApiClient().sanitize_for_serialization(pod)  # type: ignore[no-any-return]


def to_pod(manifest: Mapping[str, Any]) -> Any:
    """The API dict as a ``V1Pod``, what the executor's ``pod_override`` must be (as ``PodGenerator`` builds it)."""
    from kubernetes.client import ApiClient, Configuration, V1Pod

    return ApiClient(configuration=Configuration())._ApiClient__deserialize_model(dict(manifest), V1Pod)  # type: ignore[attr-defined]


def _pruned(spec: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in spec.items() if value not in (None, {}, [])}

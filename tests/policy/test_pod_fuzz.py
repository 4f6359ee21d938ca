"""Fuzz: every pod the Kubernetes backend would submit, from any settings it accepts, meets the admin's policy.

For each generated case (resources, requirements, ``[gpu_policy] min_pod_security``, the task's ``pod_security``, its
``container_security_context``, ``annotations``, and a pod template, as ``pod_template_dict`` or as
``pod_template_file``, built from a pod that meets the restricted level with random security fields changed, added
or broken, in the pod and in every kind of container), either

- the task is refused when the DAG is parsed, with an :class:`InvalidSettingError` naming a field the case set, or
- every object ``render_manifests()`` returns (no cluster: KubernetesPodOperator builds the pod) passes
  ``kubernetes-validate`` (strict, oldest and newest schemas, tests/backends/kubernetes/k8s_manifests.py), the
  policy's check at the task's level, the suite's own restricted-profile check (k8s_manifests) and a small
  independent baseline check here; and the task's level is one ``[gpu_policy] min_pod_security`` allows;
- a ``pod_template_file`` (read when the task runs, not at parse) may instead be refused when the pod is built
  (PodSecurityError), and then the same template given as ``pod_template_dict`` is refused at parse: the check at
  parse is never weaker than the one before submission.

One case in eight is an ``AccelerateOperator`` on two machines (an Indexed Job). Derandomized, no example
database: ``make fuzz`` runs the same 4500 cases here and 500 ``pod_override`` cases below every time (about two
minutes on 2 cores), ``make test`` a tenth of them (``helpers.fuzz_cases``; ``FUZZ_CASES`` sets the first number).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import yaml
from helpers import fuzz_cases
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from k8s_manifests import KUBERNETES_VERSIONS, validate

from airflow_gpu_provider import GpuStepOperator
from airflow_gpu_provider.exceptions import InvalidSettingError
from airflow_gpu_provider.operators.accelerate import AccelerateOperator
from airflow_gpu_provider.policy import LEVELS
from airflow_gpu_provider.policy.pods import PodSecurityError, violations

CASES = fuzz_cases(4500)
TEMPLATES = Path(tempfile.mkdtemp(prefix="pod-fuzz-"))
BOOL = st.sampled_from([None, True, False])
MAYBE_WRONG = st.sampled_from(["true", 1, "no"])  # the client would coerce them: the policy refuses them
RESTRICTED = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "runAsNonRoot": True,
    "seccompProfile": {"type": "RuntimeDefault"},
}
PROFILE = st.sampled_from(
    [{"type": "RuntimeDefault"}, {"type": "Localhost", "localhostProfile": "p.json"}, {"type": "Unconfined"}]
)
# the field came in 1.30, after the oldest schema validated (1.28): generated only as what must be refused
APPARMOR = st.just({"type": "Unconfined"})
SELINUX = st.sampled_from([{"type": "container_t"}, {"type": "spc_t"}, {"user": "system_u"}, {"level": "s0:c1,c2"}])
CAPABILITIES = st.fixed_dictionaries(
    {},
    optional={
        "add": st.lists(st.sampled_from(["NET_BIND_SERVICE", "CHOWN", "SYS_ADMIN", "NET_RAW", "DAC_READ_SEARCH"])),
        "drop": st.lists(st.sampled_from(["ALL", "NET_RAW"]), max_size=2),
    },
)
CONTAINER_FIELDS = {
    "privileged": st.one_of(BOOL, MAYBE_WRONG),
    "allowPrivilegeEscalation": BOOL,
    "runAsNonRoot": BOOL,
    "runAsUser": st.sampled_from([None, 0, 1000, 65534, "0"]),
    "runAsGroup": st.sampled_from([0, 1000]),
    "readOnlyRootFilesystem": st.booleans(),
    "capabilities": CAPABILITIES,
    "seccompProfile": PROFILE,
    "appArmorProfile": APPARMOR,
    "seLinuxOptions": SELINUX,
    "procMount": st.sampled_from(["Default", "Unmasked"]),
    "windowsOptions": st.fixed_dictionaries({"hostProcess": st.booleans()}),
}
SYSCTL = st.sampled_from(["kernel.shm_rmid_forced", "net.ipv4.tcp_syncookies", "kernel.core_pattern", "vm.swappiness"])
POD_CONTEXT_FIELDS = {
    "runAsNonRoot": BOOL,
    "runAsUser": st.sampled_from([0, 1000, 50000]),
    "fsGroup": st.sampled_from([0, 1000]),
    "supplementalGroups": st.lists(st.sampled_from([0, 100]), max_size=2),
    "seccompProfile": PROFILE,
    "appArmorProfile": APPARMOR,
    "seLinuxOptions": SELINUX,
    "windowsOptions": st.fixed_dictionaries({"hostProcess": st.booleans()}),
    "sysctls": st.lists(st.builds(lambda n: {"name": n, "value": "1"}, SYSCTL), max_size=2, unique_by=lambda s: s["name"]),
}  # fmt: skip
GOOD_VOLUMES = st.sampled_from(
    [
        {"emptyDir": {}},
        {"emptyDir": {"medium": "Memory"}},
        {"projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]}},
        {"ephemeral": {"volumeClaimTemplate": {"spec": {"accessModes": ["ReadWriteOnce"]}}}},
    ]
)
VOLUME_SOURCES = st.one_of(
    GOOD_VOLUMES,
    st.sampled_from(
        [
            {"configMap": {"name": "c"}},
            {"secret": {"secretName": "s"}},
            {"persistentVolumeClaim": {"claimName": "p"}},
            {"downwardAPI": {"items": [{"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]}},
            {"hostPath": {"path": "/"}},
            {"hostPath": {"path": "/var/run/docker.sock", "type": "Socket"}},
            {"nfs": {"server": "nfs.example.com", "path": "/data"}},
            {"gitRepo": {"repository": "https://example.com/r.git"}},
            {"csi": {"driver": "csi.example.com"}},
            {"flexVolume": {"driver": "example.com/x"}},
        ]
    ),
)
ANNOTATION_KEYS = st.sampled_from(
    [
        "container.apparmor.security.beta.kubernetes.io/base",
        "container.apparmor.security.beta.kubernetes.io/side-0",
        "seccomp.security.alpha.kubernetes.io/pod",
        "example.com/team",
    ]
)
ANNOTATIONS = st.dictionaries(
    ANNOTATION_KEYS, st.sampled_from(["runtime/default", "localhost/p", "unconfined", ""]), max_size=2
)
PROBE = st.sampled_from(
    [
        {"httpGet": {"port": 80}},
        {"tcpSocket": {"port": 80}},
        {"httpGet": {"port": 80, "host": "10.0.0.1"}},
        {"tcpSocket": {"port": 80, "host": "x"}},
    ]
)


@st.composite
def security_context(draw: st.DrawFn, fields: dict[str, st.SearchStrategy[Any]], start: dict[str, Any]) -> Any:
    """A context that meets the level (or none), with up to three random fields set or removed (mostly none)."""
    context = dict(draw(st.sampled_from([start, start, start, {}])))
    changes = draw(st.sampled_from([0, 0, 0, 0, 1, 1, 2, 3]))
    for name in draw(st.lists(st.sampled_from(sorted(fields)), min_size=changes, max_size=changes, unique=True)):
        value = draw(st.one_of(st.none(), fields[name]))
        if value is None:
            context.pop(name, None)
        else:
            context[name] = value
    return context


@st.composite
def container(draw: st.DrawFn, name: str) -> dict[str, Any]:
    item: dict[str, Any] = {"name": name, "image": "busybox"}
    if draw(st.integers(0, 5)):
        item["securityContext"] = draw(security_context(CONTAINER_FIELDS, RESTRICTED))
    if not draw(st.integers(0, 5)):
        item["ports"] = [
            {"containerPort": 8080, **draw(st.sampled_from([{}, {}, {"hostPort": 0}, {"hostPort": 8080}]))}
        ]
    if not draw(st.integers(0, 7)):
        item["readinessProbe"] = draw(PROBE)
    return item


@st.composite
def pod_template(draw: st.DrawFn) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    for name in draw(st.lists(st.sampled_from(["hostNetwork", "hostPID", "hostIPC", "hostUsers"]), max_size=2)):
        spec[name] = draw(st.sampled_from([False, False, True, "true"])) if name != "hostUsers" else draw(st.booleans())
    if draw(st.booleans()):
        start = {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
        spec["securityContext"] = draw(security_context(POD_CONTEXT_FIELDS, start))
    main = draw(container("base"))
    main.pop("image")
    spec["containers"] = [main] + [draw(container(f"side-{i}")) for i in range(draw(st.integers(0, 2)))]
    if not draw(st.integers(0, 3)):
        spec["initContainers"] = [draw(container(f"init-{i}")) for i in range(draw(st.integers(1, 2)))]
    if not draw(st.integers(0, 7)):
        spec["ephemeralContainers"] = [draw(container("debug"))]
    sources = draw(st.lists(VOLUME_SOURCES, max_size=2))
    if sources:
        spec["volumes"] = [{"name": f"v-{i}", **source} for i, source in enumerate(sources)]
    template: dict[str, Any] = {"spec": spec}
    if draw(st.booleans()):
        template["metadata"] = {"labels": {"team": "ml"}, "annotations": draw(ANNOTATIONS)}
    return template


@st.composite
def case(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    """``([gpu_policy] min_pod_security, the task's keyword arguments)``."""
    options: dict[str, Any] = {"namespace": "ml"}
    minimum = draw(st.sampled_from(LEVELS))
    if draw(st.integers(0, 2)):  # mostly a level the admin allows, sometimes any
        allowed = LEVELS[: LEVELS.index(minimum) + 1] if draw(st.integers(0, 3)) else LEVELS
        options["pod_security"] = draw(st.sampled_from(allowed))
    if not draw(st.integers(0, 4)):
        options["container_security_context"] = draw(security_context(CONTAINER_FIELDS, {}))
    if not draw(st.integers(0, 5)):
        options["annotations"] = draw(ANNOTATIONS)
    if draw(st.integers(0, 9)):
        template = draw(pod_template())
        options["pod_template_file" if draw(st.booleans()) else "pod_template_dict"] = template
    kwargs: dict[str, Any] = {"gpu_count": draw(st.integers(0, 2)), "backend_options": options}
    if not draw(st.integers(0, 7)):
        kwargs["num_machines"] = 2  # an AccelerateOperator: an Indexed Job and its Service
    kwargs |= draw(st.fixed_dictionaries({}, optional={"accelerator": st.sampled_from(["A100", "T4", "L4"])}))
    kwargs |= draw(st.fixed_dictionaries({}, optional={"requirements": st.just(["six"]), "memory": st.just("8Gi")}))
    return minimum, kwargs


def _file(template: dict[str, Any]) -> str:
    text = yaml.safe_dump(template)
    path = TEMPLATES / f"{hashlib.sha256(text.encode()).hexdigest()[:16]}.yaml"
    path.write_text(text)
    return str(path)


def train() -> int:
    return 1


def _construct(kwargs: dict[str, Any]) -> GpuStepOperator | None:
    try:
        if "num_machines" in kwargs:
            return AccelerateOperator(task_id="fuzz", python_callable=train, backend="kubernetes", **kwargs)
        return GpuStepOperator(task_id="fuzz", command=["true"], backend="kubernetes", **kwargs)
    except InvalidSettingError as err:
        assert err.field and err.field in str(err), str(err)
        root = err.field.split("[", 1)[0]
        given = {f"backend_options[{key!r}]" for key in kwargs["backend_options"]} | set(kwargs) - {"num_machines"}
        assert err.field in given or root in given, f"{err.field!r} not among {sorted(given)}: {err}"
        if "pod_security" in err.field or "Pod Security" in str(err):
            assert "[gpu_policy] min_pod_security" in str(err), str(err)
        event(f"refused at parse: {err.field}")
        return None


def assert_baseline(spec: dict[str, Any]) -> None:
    """The baseline controls that matter most, checked apart from the policy's own code."""
    assert not (spec.get("hostNetwork") or spec.get("hostPID") or spec.get("hostIPC")), spec
    assert not any("hostPath" in volume for volume in spec.get("volumes") or []), spec["volumes"]
    safe = {"kernel.shm_rmid_forced", "net.ipv4.tcp_syncookies"}  # the generated safe ones
    assert {s["name"] for s in (spec.get("securityContext") or {}).get("sysctls") or []} <= safe
    for c in [*(spec.get("initContainers") or []), *spec["containers"], *(spec.get("ephemeralContainers") or [])]:
        context = c.get("securityContext") or {}
        assert not context.get("privileged") and context.get("procMount", "Default") == "Default", c
        assert set((context.get("capabilities") or {}).get("add") or []) <= {"NET_BIND_SERVICE", "CHOWN"}, c
        assert all(not p.get("hostPort") for p in c.get("ports") or []), c


@settings(
    max_examples=CASES,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(case())
def test_every_rendered_pod_meets_the_admins_level_or_the_task_is_refused(generated) -> None:
    minimum, kwargs = generated
    options = kwargs["backend_options"]
    file_template = options.pop("pod_template_file", None)
    if file_template is not None:
        options["pod_template_file"] = _file(file_template)
    previous = os.environ.get("AIRFLOW__GPU_POLICY__MIN_POD_SECURITY")
    os.environ["AIRFLOW__GPU_POLICY__MIN_POD_SECURITY"] = minimum
    try:
        task = _construct(kwargs)
        if task is None:
            return
        level = options.get("pod_security", "restricted")
        assert LEVELS.index(level) <= LEVELS.index(minimum), f"{level} accepted under min_pod_security={minimum}"
        try:
            objects = task.render_manifests()
        except PodSecurityError as err:
            assert file_template is not None, f"accepted at parse, refused when built: {err}"
            event("refused when built (pod_template_file)")
            as_dict = {**options, "pod_template_dict": file_template}
            del as_dict["pod_template_file"]
            assert _construct({**kwargs, "backend_options": as_dict}) is None, "the check at parse is weaker"
            return
        for obj in objects:
            newer = "appArmorProfile" in json.dumps(obj)  # a privileged pod's: the field came in Kubernetes 1.30
            validate(obj, restricted=level == "restricted", versions=("1.37",) if newer else KUBERNETES_VERSIONS)
            assert violations(obj, level) == [], json.dumps(obj)[:2000]
            if obj["kind"] in ("Pod", "Job") and level != "privileged":
                assert_baseline(obj["spec"] if obj["kind"] == "Pod" else obj["spec"]["template"]["spec"])
        template = options.get("pod_template_dict") or file_template or {}
        parts = sum(len(template.get("spec", {}).get(f) or []) for f in ("initContainers", "containers", "volumes"))
        kind = "Job" if "num_machines" in kwargs else "pod"
        event(f"{kind} accepted at {level}" + (f", with a template of {min(parts, 3)}+ parts" if template else ""))
    finally:
        if previous is None:
            os.environ.pop("AIRFLOW__GPU_POLICY__MIN_POD_SECURITY", None)
        else:
            os.environ["AIRFLOW__GPU_POLICY__MIN_POD_SECURITY"] = previous


# ---------------------------------------------------------------------------------------------- pod_override
EXECUTOR_CASES = max(1, CASES // 9)  # 500 of the 5000


@st.composite
def executor_case(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    """``([gpu_policy] min_pod_security, the executor task's keyword arguments)``: a pod_override and pod options."""
    minimum = draw(st.sampled_from(LEVELS))
    options: dict[str, Any] = {}
    if draw(st.integers(0, 2)):
        options["pod_security"] = draw(st.sampled_from(LEVELS[: LEVELS.index(minimum) + 1]))
    if not draw(st.integers(0, 4)):
        options["container_security_context"] = draw(security_context(CONTAINER_FIELDS, {}))
    kwargs: dict[str, Any] = {"gpu_count": draw(st.integers(1, 2)), "backend_options": {"kubernetes": options}}
    if draw(st.integers(0, 9)):
        kwargs["executor_config"] = {"pod_override": draw(pod_template())}
    return minimum, kwargs


def worker_pod(task: GpuStepOperator) -> dict[str, Any]:
    """What KubernetesExecutor submits for the task: the cncf provider's construct_pod over its shipped template."""
    from airflow.providers.cncf.kubernetes import pod_generator
    from kubernetes.client import ApiClient

    template = Path(pod_generator.__file__).parent / "kubernetes_executor_templates" / "basic_template.yaml"
    pod = pod_generator.PodGenerator.construct_pod(
        dag_id="d", task_id=task.task_id, pod_id="d-fuzz-1", try_number=1, kube_image="apache/airflow:3.3.2",
        date=None, args=["airflow", "tasks", "run"], namespace="airflow", scheduler_job_id="1", run_id="r",
        pod_override_object=pod_generator.PodGenerator.from_obj(task.executor_config),
        base_worker_pod=pod_generator.PodGenerator.deserialize_model_file(str(template)),
    )  # fmt: skip
    return ApiClient().sanitize_for_serialization(pod)  # type: ignore[no-any-return]


@settings(
    max_examples=EXECUTOR_CASES,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(executor_case())
def test_every_pod_override_meets_the_admins_level_or_the_task_is_refused(generated) -> None:
    minimum, kwargs = generated
    level = kwargs["backend_options"]["kubernetes"].get("pod_security", "restricted")
    saved = {
        name: os.environ.get(name) for name in ("AIRFLOW__GPU_POLICY__MIN_POD_SECURITY", "AIRFLOW__CORE__EXECUTOR")
    }
    os.environ |= {"AIRFLOW__GPU_POLICY__MIN_POD_SECURITY": minimum, "AIRFLOW__CORE__EXECUTOR": "KubernetesExecutor"}
    try:
        try:
            task = GpuStepOperator(task_id="fuzz", command=["true"], backend="executor", **kwargs)
        except InvalidSettingError as err:
            assert err.field.startswith(("executor_config['pod_override']", "backend_options['kubernetes']")), err
            assert err.field in str(err), str(err)
            message = str(err)
            if "Pod Security" in message:  # the policy's refusals (the others: the override and the task disagree)
                assert getattr(err, "option", None) == "min_pod_security" and "[gpu_policy] min_pod_security" in message
            event(f"refused at parse: {err.field}")
            return
        override = worker_pod(task)
        assert violations(override, level) == [], json.dumps(override)[:2000]
        newer = "appArmorProfile" in json.dumps(override)
        validate(override, restricted=level == "restricted", versions=("1.37",) if newer else KUBERNETES_VERSIONS)
        if level != "privileged":
            assert_baseline(override["spec"])
        event(f"worker pod accepted at {level}" + (" with a pod_override" if "executor_config" in kwargs else ""))
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value

"""The ``[gpu_policy]`` section: the admin's allow-lists, read the same way by every process that judges a task.

Default deny: each option allows DAG authors more of a host, and is named in the error a task gets when it asks for
more (docs/security.md). ONE reader, :func:`read`, standard library only, serves the DAG processor, the worker and
the triggerer (through Airflow's configuration: ``config.policy_values()``) and the Docker engine's authorization
plugin (from its own root-owned file: ``policy/authz/``), so that both read the same values the same way.

The allow-lists were ``[gpu]`` options until 0.x: an old name still set is read for one more release, with a warning
naming its replacement (:data:`RENAMED`).
"""

from __future__ import annotations

from collections.abc import Callable

from airflow_gpu_provider.config.options import Option

SECTION = "gpu_policy"
OLD_SECTION = "gpu"
#: The kinds of ``allowed_clusters`` (``KIND=ADDRESS``): a backend that reaches a cluster adds its kind here.
CLUSTER_KINDS: tuple[str, ...] = ("docker", "ray", "ray-unauthenticated", "slurm")
#: The kinds of ``allowed_objects`` (``KIND=NAME``): the cluster objects a task may name that RBAC (a pod's) or
#: Slurm's associations (a job's: every task submits as the worker's one user) do not bound.
POD_OBJECT_KINDS: tuple[str, ...] = (
    "namespace", "service_account", "runtime_class", "priority_class", "kueue_queue", "kueue_priority_class",
)  # fmt: skip
SLURM_OBJECT_KINDS: tuple[str, ...] = ("partition", "account", "qos", "reservation")
OBJECT_KINDS: tuple[str, ...] = POD_OBJECT_KINDS + SLURM_OBJECT_KINDS
#: An option's name in ``[gpu]`` before it moved here, where it had another one.
RENAMED = {"allowed_clusters": "allowed_docker_engines", "allowed_objects": "allowed_kubernetes_objects"}
#: Options new in 0.2.0, never in ``[gpu]``: no old name to read.
NEW = frozenset({"deployment", "allow_unenforced_gpu_shares"})
#: ``lookup(section, option)``: the option's text, or ``None`` when it is not set (a default is not "set")
Lookup = Callable[[str, str], "str | None"]

POLICY_OPTIONS: tuple[Option, ...] = (
    Option(
        "allowed_mount_roots",
        "string",
        "",
        "Host folders that Docker tasks may bind-mount (backend_options mounts), each with the most access allowed: "
        "comma-separated PATH:ro or PATH:rw (ro when omitted). A mount's source must be such a root or lie beneath "
        "a read-only one; every folder on the way must be root's or the worker's and no symbolic link. Empty: no "
        "host folder may be mounted.",
        "/data/models:ro, /data/scratch:rw",
    ),
    Option(
        "allowed_volumes",
        "string",
        "",
        "Named Docker volumes that Docker tasks may mount, comma-separated. Empty: none.",
        "hf-cache, datasets",
    ),
    Option(
        "allowed_capabilities",
        "string",
        "",
        "Linux capabilities that Docker tasks may keep (backend_options cap_add); every other one is dropped. "
        "Comma-separated names such as SYS_PTRACE, IPC_LOCK. ALL and SYS_ADMIN-like escapes are the admin's "
        "choice, never a default. Empty: none.",
        "IPC_LOCK",
    ),
    Option(
        "allowed_users",
        "string",
        "",
        "Users that Docker tasks may run as (backend_options user: a name, uid or uid:gid), besides the default, "
        "the worker's own uid:gid. root (0) only when listed. Empty: the worker's user only.",
        "1000:1000",
    ),
    Option(
        "allowed_groups",
        "string",
        "",
        "Supplementary groups that Docker tasks may join (backend_options group_add), besides the device groups "
        "the provider adds itself for AMD and Intel GPUs (video, render). Empty: none.",
        "ml",
    ),
    Option(
        "allowed_clusters",
        "string",
        "",
        "Engines and clusters that tasks may reach besides the worker's default ones: comma-separated KIND=ADDRESS, "
        "KIND docker (backend_options docker_url; the default: $DOCKER_HOST, else unix://var/run/docker.sock), ray "
        "(backend_options address or ray_conn_id; the default: the ray_default connection's cluster, which must "
        "enforce Ray's token auth), ray-unauthenticated (a Ray cluster tasks may use without token auth) or slurm "
        "(the Airflow connection backend_options slurm_conn_id names; the default: slurm_default). "
        "Checked at parse, on the worker and in the triggerer, which logs in nowhere; TLS to a tcp:// engine comes "
        "from the worker's and triggerer's own DOCKER_CERT_PATH and DOCKER_TLS_VERIFY. Empty: the defaults only.",
        "docker=tcp://gpu-host-1:2376, ray=http://ray-b:8265, slurm=slurm_team_a",
    ),
    Option(
        "allowed_network_modes",
        "string",
        "bridge,none",
        "Docker network modes that Docker tasks may ask for (backend_options network_mode): bridge, none, host, a "
        "network's name, container:<id> (only as listed). A task that names none gets the engine's default.",
        "bridge,none,ml-net",
    ),
    Option(
        "allowed_ipc_modes",
        "string",
        "private,shareable,none",
        "Docker IPC modes that Docker tasks may ask for (backend_options ipc_mode); host and container:<id> only "
        "when listed.",
        "private,host",
    ),
    Option(
        "allowed_build_paths",
        "string",
        "",
        "Worker files and folders that a derived image's build may read (ImageSettings find_links folders, "
        "backend_options ca_bundle): comma-separated paths, each file or folder beneath them. The Docker "
        "connection's ca_bundle is always allowed. Empty: nothing of the worker's goes into an image but that one.",
        "/opt/wheels",
    ),
    Option(
        "allowed_checkpoint_roots",
        "string",
        "",
        "Roots that a task's checkpoint= may name, besides [gpu] checkpoint_root (or the state dir's "
        "checkpoints folder): comma-separated absolute paths or URIs (s3://bucket/prefix), a task's root must be one "
        "or lie beneath one. Only these roots' run folders are ever deleted.",
        "/shared/ckpt, s3://ml-bucket/ckpt",
    ),
    Option(
        "min_pod_security",
        "string",
        "restricted",
        "The weakest Pod Security Standards level that a GPU pod may have (backend_options pod_security, "
        "templates, pod_override): restricted, baseline or privileged. The whole pod is checked against it "
        "before it is submitted.",
        "baseline",
    ),
    Option(
        "allowed_objects",
        "string",
        "",
        "Cluster objects that GPU pods (the kubernetes backend's pods and Jobs, KubernetesExecutor pod_overrides) "
        "and Slurm jobs may name, which RBAC or Slurm's associations do not bound: comma-separated KIND=NAME, KIND "
        "one of namespace, service_account, runtime_class, priority_class, kueue_queue, kueue_priority_class "
        "(pods) or partition, account, qos, reservation (Slurm jobs); NAME * allows any of that kind. A pod that "
        "names none gets the deployment's own: the connection's (or [kubernetes_executor]) namespace and Kueue "
        "queue, the namespace's default service account, no runtime or priority class; a Slurm job the cluster's "
        "defaults. Empty: only those.",
        "namespace=ml, service_account=gpu-trainer, kueue_queue=team-a, partition=gpu, account=ml",
    ),
    Option(
        "allow_unenforced_gpu_shares",
        "boolean",
        "False",
        "Whether a share of one GPU (gpu_count=0.25, gpu_share) may run where nothing enforces it: no MPS on the host "
        "and no PyTorch in the task (a command, a JAX task). False: such a try is refused, naming why.",
        "True",
    ),
    Option(
        "deployment",
        "string",
        "",
        "This Airflow deployment's name in the label of every container the provider makes (a Docker engine may be "
        "shared by several deployments): the Docker authorization plugin lets a deployment reach only its own, and "
        "requires this option, the same in its policy file as on the workers. Empty: a digest of the Execution "
        "API's URL and AIRFLOW_HOME.",
        "ml-prod",
    ),
)
_BY_NAME = {option.name: option for option in POLICY_OPTIONS}


def read(lookup: Lookup, warn: Callable[[str], None]) -> dict[str, str]:
    """Every ``[gpu_policy]`` option's text (its default where it is not set), an old ``[gpu]`` name's for one release.

    :param lookup: where the options come from: Airflow's configuration, or the plugin's policy file
    :param warn: told once per old name that is still set, naming its replacement
    """
    values = {}
    for option in POLICY_OPTIONS:
        value, old_name = lookup(SECTION, option.name), RENAMED.get(option.name, option.name)
        old = None if option.name in NEW else lookup(OLD_SECTION, old_name)
        if old is not None and value in (None, option.default):
            warn(f"[{OLD_SECTION}] {old_name} is deprecated and read for one more release only: set "
                 f"[{SECTION}] {option.name} instead")  # fmt: skip
            value = _renamed(option.name, old)
        elif old is not None:
            warn(f"[{OLD_SECTION}] {old_name} is ignored: [{SECTION}] {option.name} is set (remove the old name)")
        values[option.name] = (option.default if value is None else value).strip()
    return values


def _renamed(name: str, old: str) -> str:
    """An old value in the new option's form: ``allowed_docker_engines``'s URLs become ``docker=URL``."""
    if name != "allowed_clusters":
        return old
    return ", ".join(f"docker={url.strip()}" for url in old.split(",") if url.strip())


def option(name: str) -> Option:
    """The ``[gpu_policy]`` option ``name``."""
    return _BY_NAME[name]

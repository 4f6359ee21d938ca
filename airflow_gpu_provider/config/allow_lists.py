"""The ``[gpu]`` options with which the deployment's admin allows DAG authors more of a host: default deny.

Each is read by the policy layer (``policy/``) and named in the error a DAG author gets when a task asks for more
(docs/security.md lists them with their defaults).
"""

from __future__ import annotations

from airflow_gpu_provider.config.options import Option

ALLOW_LISTS: tuple[Option, ...] = (
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
        "allowed_docker_engines",
        "string",
        "",
        "Docker engines that Docker tasks may reach (backend_options docker_url), besides the worker's default one "
        "($DOCKER_HOST, else unix://var/run/docker.sock): comma-separated URLs. Checked at parse, on the worker and "
        "in the triggerer (a deferred task's trigger), which logs in nowhere; TLS to a tcp:// engine comes from the "
        "worker's and triggerer's own DOCKER_CERT_PATH and DOCKER_TLS_VERIFY. Empty: the default engine only.",
        "tcp://gpu-host-1:2376, tcp://gpu-host-2:2376",
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
        "backend_options ca_bundle): comma-separated paths, each file or folder beneath them. [gpu] ca_bundle "
        "is always allowed. Empty: nothing of the worker's goes into an image but [gpu] ca_bundle.",
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
        "allowed_kubernetes_objects",
        "string",
        "",
        "Cluster objects that GPU pods (the kubernetes backend's pods and Jobs, KubernetesExecutor pod_overrides) "
        "and Slurm jobs may name, which RBAC or Slurm's associations do not bound: comma-separated KIND=NAME, KIND "
        "one of namespace, service_account, runtime_class, priority_class, kueue_queue, kueue_priority_class "
        "(pods) or partition, account, qos, reservation (Slurm jobs); NAME * allows any of that kind. A pod that "
        "names none gets the deployment's own: the connection's (or [kubernetes_executor]) namespace, the "
        "namespace's default service account, no runtime or priority class, [gpu] kueue_queue; a Slurm job the "
        "cluster's defaults. Empty: only those.",
        "namespace=ml, service_account=gpu-trainer, kueue_queue=team-a, partition=gpu, account=ml",
    ),
)

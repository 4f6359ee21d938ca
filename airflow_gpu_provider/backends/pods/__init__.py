"""The pure Kubernetes pod mapping shared by the kubernetes backend's pods and the executor backend's
KubernetesExecutor ``pod_override``: resources, node labels and placement, security contexts, the pod options both
take. Not a backend (no registry entry); no client, no I/O."""

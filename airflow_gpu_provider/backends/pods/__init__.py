"""The pure Kubernetes pod mapping shared by the kubernetes and executor backends.

The kubernetes backend's pods and the executor backend's KubernetesExecutor ``pod_override`` take the same pod
options and map resources, node labels, placement and security contexts the same way. Not a backend (no registry
entry); no client, no I/O.
"""

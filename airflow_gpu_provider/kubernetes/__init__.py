"""Pieces of the Kubernetes backend: options, resources, scheduling, requirements, pending pods, multi-node.

Everything here except :mod:`~airflow_gpu_provider.kubernetes.operator`,
:mod:`~airflow_gpu_provider.kubernetes.multinode_run` and :mod:`~airflow_gpu_provider.kubernetes.render` is pure
and imports neither the kubernetes client nor the cncf-kubernetes provider, so DAG parsing stays cheap.
Objects are built as plain dicts in the Kubernetes API's own (camelCase) form.
"""

"""The Kubernetes backend: a pod per task try (KubernetesPodOperator), an Indexed Job for a multi-node launch.

``options.py`` (parse time), ``plan.py`` and its pure pieces (``resources``, ``labels``, ``scheduling``,
``requirements``, ``container``, ``multinode``, ``pending``) build plain Kubernetes API dicts without the client;
``backend.py``, ``pod_operator.py`` and ``multinode_run.py`` run them with the cncf-kubernetes provider.
"""

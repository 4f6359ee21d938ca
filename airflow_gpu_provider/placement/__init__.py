"""Placement at DAG parse: the GPU pool of a task and, on the executor backend, what Airflow's executor understands.

- :mod:`.place`: the one seam, called by the operator and the decorator: pool, queue, executor, executor_config;
- :mod:`.executors`: which executor of ``[core] executor`` a GPU task goes to, and its queue (Celery, Edge);
- :mod:`.pod_override`: the KubernetesExecutor worker pod's ``pod_override``, made by the Kubernetes backend's own
  mapping modules (resources, scheduling, container), merged with the task's own ``pod_override``;
- :mod:`.pools`: the GPU pool of each worker class, and the pools the scheduler creates or checks when it starts.

It sits above the backends (like the operators): it may read the Kubernetes backend's pure mapping modules, never a
backend's run half.
"""

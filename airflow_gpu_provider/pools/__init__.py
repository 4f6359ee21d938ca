"""GPU pools: the Airflow pool a GPU task joins, and the scheduler's side of it.

``placement.py``: the pool of a task (at DAG parse); ``listener.py``: the pools the scheduler creates and the tasks
it fails at once; ``policy.py``: the ``airflow.policy`` hook that sizes ``gpu_count="all"``.
"""

"""GPU pools: the pool a GPU task joins (placement, at DAG parse), the pools the scheduler creates and the tasks it
fails at once (listener), and the ``airflow.policy`` hook that sizes ``gpu_count=\"all\"`` (policy)."""

"""The executor backend: Airflow's executor places the task (a GPU pod, queue or executor); it runs like local.

Only the options half lives here. The placement is made when the DAG is parsed, by :mod:`airflow_gpu_provider.placement`
(above the backends, as it speaks to Airflow's executors); the run half is the local backend's class.
"""

"""Checkpoint folders, the Airflow-facing half (the runtime's half is ``runtime/checkpoint.py``).

``location.py``: where a task try's checkpoints live; ``mixin.py``: the ``checkpoint=`` argument; ``cleanup.py``:
a successful run's folders deleted (a listener).
"""

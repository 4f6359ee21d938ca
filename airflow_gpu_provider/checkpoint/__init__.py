"""Checkpoint folders: where a task try's checkpoints live (location), the ``checkpoint=`` argument (mixin), and a
successful run's cleanup (a listener). The runtime's half is ``runtime/checkpoint.py``."""

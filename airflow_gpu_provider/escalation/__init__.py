"""OOM escalation: which rung of its ``on_oom`` ladder a try runs on, and the history of the tries.

The ladder itself is ``settings/escalation.py`` (what a DAG author writes); what an OOM is, is
``runtime/escalation.py``; ``tries.py`` decides the rung, ``store.py`` keeps the history between tries.
"""

"""The Docker engine's authorization plugin: the provider's exact calls, judged whole, for every client of the engine.

A DAG file's own code runs in the task process on the worker (Airflow's task runner imports it there), and so do
callbacks and plain ``@task``s: that process holds the worker's Docker socket, and could ask the engine for anything.
With this plugin the engine asks first: ``dockerd --authorization-plugin=airflow-gpu`` sends every API call to the
daemon, which allows only the provider's own calls in the exact form its client writes them, judged with the same
``[gpu_policy]`` and the same create check as the provider's own (``policy/engine.py``). A root daemon of the
standard library only, run with ``python3 -I -S`` from a root-owned zip archive: it never imports Airflow.

- ``calls.py``: the provider's calls, their exact syntax (everything else refused)
- ``judge.py``: what a matching call may do; ``stored.py``: the engine's containers judged as their creates
- ``helper.py``: the judge, forked from the daemon, with the workers' user's ids and no way back to root
- ``server.py``: the daemon (the engine's ``authz`` protocol on a unix socket, the judge's timeout)
- ``settings.py``: the policy file, root's alone; ``install.py``: the zip archive and its install
- ``__main__.py``: the command (``airflow-gpu-docker-authz serve|check|install``)
"""

"""The Docker engine's authorization plugin: rules D1-D5 for every client of the engine, not only the provider.

A DAG file's own code runs in the task process on the worker (Airflow's task runner imports it there), and so do
callbacks and plain ``@task``s: that process holds the worker's Docker socket, and could ask the engine for any
container. With this plugin the engine asks first: ``dockerd --authorization-plugin=airflow-gpu`` (or
``"authorization-plugins"`` in ``daemon.json``) sends every API call to ``airflow-gpu-docker-authz --socket PATH``,
which answers with the same ``[gpu]`` policy and the same create check as the provider's own (``policy/engine.py``).

- ``endpoints.py``: which calls are allowed, judged or refused (default deny)
- ``archive.py``: what an upload into a container with a writable host folder may hold
- ``server.py``: the engine's ``authz`` protocol (JSON over HTTP on a unix socket), standard library only
- ``__main__.py``: the command (``airflow-gpu-docker-authz``): the socket, the worker's identity, the policy
"""

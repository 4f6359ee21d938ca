"""The Docker backend: a container per task try on a Docker engine (DockerHook), derived images for requirements.

``options.py`` (parse time), ``plan.py`` with ``container.py`` (the resource mapping) and ``images/spec.py``
are pure; ``backend.py``, ``files.py`` and ``images/engine.py`` talk to the engine.
"""

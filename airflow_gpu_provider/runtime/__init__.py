"""The stdlib-only runtime that runs inside child processes, containers and pods.

Shipped as one zip archive under the top-level name ``airflow_gpu_runtime`` (``task/runtime_zip.py`` builds it), so
its modules import only the standard library and each other, relatively. The contract with the worker, and the
only module the worker imports besides ``cuda.py``: ``protocol.py``.
"""

"""Listeners registered by :mod:`airflow_gpu_provider.plugin`."""

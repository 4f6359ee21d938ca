"""Hooks."""

from __future__ import annotations

from airflow_gpu_provider.hooks.cuda import CudaHook

__all__ = ["CudaHook"]

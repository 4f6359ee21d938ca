"""Container images: CUDA parent images (``catalogue``), derived images (``dockerfile``, ``recipe``, ``engine``).

A derived image's build: its recipe (``recipe``), what it is made of and its tag (``dockerfile``), the archives sent
to the engine (``context``), the install container of an index with credentials (``install``), who built what and
what a dead builder left (``builds``), and the engine calls (``engine``).
"""

from airflow_gpu_provider.exceptions import GpuTaskError


class ImageError(GpuTaskError):
    """An image could not be found, pulled, built or pushed."""

"""Container images: CUDA parent images (``catalogue``), derived images (``spec``, ``recipe``, ``engine``).

A derived image's build: its recipe (``recipe``), what it is made of and its tag (``spec``), the archives its
containers get (``context``), the install container and the commit (``install``), who built what and what a dead
builder left (``builds``), and the engine calls (``engine``).
"""

from airflow_gpu_provider.exceptions import GpuTaskError


class ImageError(GpuTaskError):
    """An image could not be found, pulled, built or pushed."""

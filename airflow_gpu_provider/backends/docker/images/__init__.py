"""Container images: CUDA parent images (``catalogue``), derived images (``dockerfile``, ``engine``)."""

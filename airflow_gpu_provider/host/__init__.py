"""Worker-host resources for the local backend: GPU inventory, the GPU allocator, cached virtualenvs."""

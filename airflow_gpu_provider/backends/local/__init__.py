"""The local backend (the embedded default): a child process on the worker, with the GPUs the host allocator gave it."""

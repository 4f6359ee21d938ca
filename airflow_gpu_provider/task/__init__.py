"""One task try as every backend sees it: the request, the on_missing_gpu policies, the shared environment."""

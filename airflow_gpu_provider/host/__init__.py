"""The GPUs of this host, shared by the local and Docker backends: the inventory and the allocator."""

"""Backends: each translates a TaskRequest into its own spec (``plan``) and runs it (``run``)."""

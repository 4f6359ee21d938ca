"""The Ray backend: one Ray job per task try, through Ray's Jobs API (docs/ray.md)."""

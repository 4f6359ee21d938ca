"""A project package next to the test DAG files."""

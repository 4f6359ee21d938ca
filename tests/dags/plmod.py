"""A project module next to the test DAG files: what a task imports from its DAG's folder (no DAG in it)."""


def double(value: int) -> int:
    return 2 * value

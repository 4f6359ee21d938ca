"""deploy/helm/values-gpu.yaml is valid for the official Airflow Helm chart it names (1.19.0), by the chart's own schema.

The schema is the chart's ``values.schema.json`` (tests/data/helm/README.md: its commit and sha256). The chart's
worker sets are open objects in it; each set's fields are checked against the ``workers`` and ``workers.celery``
sections they overwrite, as the chart's templates merge them.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import jsonschema
import pytest
import yaml
from conftest import REPO

VALUES = REPO / "deploy" / "helm" / "values-gpu.yaml"
SCHEMA = REPO / "shared" / "helm" / "airflow-chart-1.19.0" / "values.schema.json"
SHA256 = "a8c58db04331a07692c5bf7f61c8b54a0a345e44437147170259ec7e4fe7267a"


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    if not SCHEMA.exists():
        why = (
            f"the chart's schema is not at {SCHEMA.relative_to(REPO)} (tests/data/helm/README.md says where it is from)"
        )
        # fetched public data is kept out of the repository (shared/ is git-ignored): a fresh clone, CI's too, has none
        pytest.skip(why)
    data = SCHEMA.read_bytes()
    assert hashlib.sha256(data).hexdigest() == SHA256, "not the pinned chart 1.19.0 schema (tests/data/helm/README.md)"
    return json.loads(data)


def _within(schema: dict[str, Any], *path: str) -> dict[str, Any]:
    """The sub-schema at ``properties.<path>``, with the root's definitions (its ``$ref`` targets)."""
    node = schema
    for key in path:
        node = node["properties"][key]
    return {**node, "definitions": schema["definitions"]}


def test_the_values_are_valid_for_the_chart(schema):
    values = yaml.safe_load(VALUES.read_text())
    jsonschema.Draft7Validator(schema).validate(values)


def test_each_worker_set_overwrites_only_what_the_chart_lets_it(schema):
    sets = yaml.safe_load(VALUES.read_text())["workers"]["celery"]["sets"]
    assert [s["name"] for s in sets] == ["gpu"]
    for worker_set in sets:
        for key, value in worker_set.items():
            if key == "name":
                continue
            section = (
                ("workers", "celery") if key in _within(schema, "workers", "celery")["properties"] else ("workers",)
            )
            assert key in _within(schema, *section)["properties"], f"workers.celery.sets[].{key} is no worker field"
            jsonschema.Draft7Validator(_within(schema, *section, key)).validate(value)


def test_the_gpu_set_asks_for_gpus_on_gpu_nodes_and_the_triggerer_runs():
    values = yaml.safe_load(VALUES.read_text())
    (gpu,) = values["workers"]["celery"]["sets"]
    assert gpu["queue"] == "gpu" and gpu["resources"]["limits"]["nvidia.com/gpu"] == "4"
    assert gpu["nodeSelector"] and gpu["tolerations"][0]["key"] == "nvidia.com/gpu"
    assert values["triggerer"]["enabled"] and values["executor"] == "CeleryExecutor"
    assert values["config"]["gpu"]["devices"] == "auto" and "gpu_policy" in values["config"]


def test_a_mistake_is_caught(schema):
    """The schema is strict where the chart is: a misspelt worker field, a resource that is no quantity."""
    values = yaml.safe_load(VALUES.read_text())
    values["workers"]["nodeSelectr"] = {}
    with pytest.raises(jsonschema.ValidationError, match="nodeSelectr"):
        jsonschema.Draft7Validator(schema).validate(values)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft7Validator(_within(schema, "workers", "tolerations")).validate([{"effect": 3}])

"""Code people write inside a task: a dataclass, an enum, attrs and pydantic models, a typed helper.

This file has no ``from __future__ import annotations``, so annotations in the task's body are evaluated where they
stand, as they are in this module; its own signature names a module-level import (``Path``), which does not travel.
"""

import datetime
from pathlib import Path

from airflow.sdk import DAG

from airflow_gpu_provider import gpu_task

START = datetime.datetime(2024, 1, 1)


def typed_code_in_the_function(rate: float, out: Path | None = None) -> dict:
    import dataclasses
    import enum
    import typing

    import attrs
    import pydantic

    @dataclasses.dataclass(frozen=True)
    class Config:
        rate: float
        layers: int = 2

    class Stage(enum.Enum):
        WARMUP = "warmup"
        TRAIN = "train"

    @attrs.define
    class Counter:
        steps: int = 0

    class Metrics(pydantic.BaseModel):
        config: Config
        stage: Stage
        loss: float

    def scaled(config: Config, stage: Stage) -> float:
        return config.rate * (0.1 if stage is Stage.WARMUP else 1.0)

    config = Config(rate)
    return {
        "config": dataclasses.asdict(config),
        "field_types": [f.type.__name__ for f in dataclasses.fields(Config)],  # evaluated: no future import here
        "hints": {name: hint.__name__ for name, hint in typing.get_type_hints(scaled).items()},
        "scaled": scaled(config, Stage.WARMUP),
        "metrics": Metrics(config=config, stage="train", loss=0.5).model_dump(mode="json"),
        "counter": attrs.asdict(Counter(3)),
        "module": Config.__module__,
    }


with DAG("function_scope", schedule=None, start_date=START):
    gpu_task(task_id="typed_code")(typed_code_in_the_function)(0.5)

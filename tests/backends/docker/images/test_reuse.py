"""Which derived image a changed requirement list is built on (pure: ``client.images()`` entries as input)."""

from __future__ import annotations

import json
from typing import NamedTuple

from airflow_gpu_provider.backends.docker.images.reuse import (
    DEPTH_LABEL,
    MAX_DEPTH,
    RECIPE_LABEL,
    REQUIREMENTS_LABEL,
    pick_base,
    requirement_keys,
)


class Spec(NamedTuple):
    recipe: str
    requirements: tuple[tuple[str, str], ...]
    on_base: None = None


def image(id_: str, requirements: list[str], *, recipe: str = "r", depth: int = 0, created: int = 1, tag: bool = True):
    return {
        "Id": id_,
        "Created": created,
        "RepoTags": [f"derived:{id_}"] if tag else ["<none>:<none>"],
        "Labels": {
            RECIPE_LABEL: recipe,
            REQUIREMENTS_LABEL: json.dumps([list(k) for k in requirement_keys(requirements)]),
            DEPTH_LABEL: str(depth),
        },
    }


WANTED = Spec("recipe", requirement_keys(["numpy==2.2.6", "pandas==2.2.3", "tqdm==4.67.1"]))


def test_the_image_sharing_most_requirements_then_the_newest_is_the_base():
    images = [
        image("one", ["numpy==2.2.6"], created=3),
        image("two-old", ["numpy==2.2.6", "pandas==2.2.3"], created=1),
        image("two-new", ["pandas==2.2.3", "numpy==2.2.6"], created=2),
    ]
    base = pick_base(images, WANTED, "r")
    assert base is not None and (base.id, base.shared, base.depth) == ("two-new", 2, 0)


def test_no_base_holds_a_requirement_the_list_lacks_or_another_version_or_is_another_recipe():
    images = [
        image("extra", ["numpy==2.2.6", "pandas==2.2.3", "scipy==1.15.0"]),  # scipy would stay in the image
        image("old-pandas", ["numpy==2.2.6", "pandas==2.1.0"]),  # what pandas 2.1.0's build did would stay too
        image("nothing", []),
        image("other-recipe", ["numpy==2.2.6"], recipe="other"),
        image("untagged", ["numpy==2.2.6"], tag=False),  # a build's step, or an image whose tag was removed
        image("deep", ["numpy==2.2.6"], depth=MAX_DEPTH),
        {"Id": "bad", "RepoTags": ["x:1"], "Labels": {RECIPE_LABEL: "r", REQUIREMENTS_LABEL: "not json"}},
        {"Id": "no-labels", "RepoTags": ["x:2"], "Labels": None},
    ]
    assert pick_base(images, WANTED, "r") is None


def test_requirements_are_keyed_by_project_name_and_a_digest_without_secrets():
    keys = requirement_keys(["Foo_Bar[extra]>=1", "pkg @ https://user:s3cret@host/pkg.whl"])
    assert [name for name, _ in keys] == ["foo-bar", "pkg"]
    redacted = requirement_keys(["pkg @ https://user:other@host/pkg.whl"])
    assert keys[1] == redacted[0]  # the digest is of the redacted text: a rotated token changes nothing
    assert "s3cret" not in json.dumps(keys)

from __future__ import annotations

import pytest

from airflow_gpu_provider.exceptions import InvalidSettingError
from airflow_gpu_provider.settings import ImageSettings


def test_defaults():
    image = ImageSettings()
    assert image.requirements == ()
    assert image.python_package_installer == "uv"
    assert image.requirements_hash == "none"


def test_requirements_are_normalised_and_hashed_order_independently():
    a = ImageSettings(requirements=["numpy >= 1.26", "Torch==2.5.1"])
    b = ImageSettings(requirements=["Torch==2.5.1", "numpy>=1.26"])
    assert a.requirements == ("numpy>=1.26", "Torch==2.5.1")
    assert a.requirements_hash == b.requirements_hash
    assert len(a.requirements_hash) == 12


def test_hash_changes_with_installer_and_index():
    base = ImageSettings(requirements=["numpy"])
    assert (
        base.requirements_hash
        != ImageSettings(requirements=["numpy"], python_package_installer="pip").requirements_hash
    )
    assert (
        base.requirements_hash
        != ImageSettings(requirements=["numpy"], index_url="https://mirror/simple").requirements_hash
    )


def test_credentials_change_neither_the_hash_nor_the_install_options():
    """A rotated token must not rebuild cached venvs and images, and no digest of a secret goes into their labels."""

    def image(token: str) -> ImageSettings:
        return ImageSettings(
            requirements=[f"name @ https://{token}@example.org/name-1.0.tar.gz"],
            index_url=f"https://user:{token}@mirror.example/simple",
            extra_index_urls=[f"https://{token}@extra.example/simple"],
            find_links=[f"https://user:{token}@links.example/wheels/"],
        )

    old, new = image("s3cr3t-old"), image("s3cr3t-new")
    assert old.requirements_hash == new.requirements_hash
    assert "s3cr3t" not in repr(old.install_options)
    assert old.install_options["index_url"] == "https://***@mirror.example/simple"
    assert old.installer_index_args()[1] == "https://user:s3cr3t-old@mirror.example/simple"  # the installer gets them
    assert old.requirements_hash != image_without_index().requirements_hash


def image_without_index() -> ImageSettings:
    return ImageSettings(requirements=["name @ https://example.org/name-1.0.tar.gz"])


def test_pep508_markers_and_extras_and_urls():
    image = ImageSettings(
        requirements=['pkg[extra]>=1; python_version >= "3.10"', "name @ https://example.org/name-1.0.tar.gz"]
    )
    assert len(image.requirements) == 2


def test_installer_index_args():
    image = ImageSettings(index_url="https://m/simple", extra_index_urls=["https://x/simple"], find_links=["/wheels"])
    assert ImageSettings(find_links=["file:///srv/w", "https://h/w/"], index_url="file:///srv/simple").find_links
    assert image.installer_index_args() == [
        "--index-url",
        "https://m/simple",
        "--extra-index-url",
        "https://x/simple",
        "--find-links",
        "/wheels",
    ]


@pytest.mark.parametrize(
    ("kwargs", "field", "fragment"),
    [
        ({"requirements": ["numpy>="]}, "requirements", "not a PEP 508 requirement"),
        ({"requirements": ["pip install torch"]}, "requirements", "not a PEP 508 requirement"),
        ({"requirements": "numpy"}, "requirements", "expected a list of strings"),
        ({"requirements": ["numpy", ""]}, "requirements", "non-empty string"),
        ({"python_package_installer": "conda"}, "python_package_installer", "'uv' or 'pip'"),
        ({"parent_image": "PyTorch/PyTorch:latest"}, "parent_image", "not a Docker image reference"),
        ({"parent_image": "pytorch/pytorch latest"}, "parent_image", "not a Docker image reference"),
        ({"environment": {"1BAD": "x"}}, "environment", "not an environment variable name"),
        ({"environment": {"GOOD": 1}}, "environment['GOOD']", "values must be strings"),
        ({"environment": ["A=1"]}, "environment", "expected a mapping"),
        ({"find_links": "/wheels"}, "find_links", "expected a list"),
        ({"index_url": ""}, "index_url", "expected a URL"),
        # hardening: installer options and other strings that are not locations
        ({"index_url": "--no-index"}, "index_url", "not a URL"),
        ({"index_url": "pypi.example.com/simple"}, "index_url", "not a URL"),
        ({"extra_index_urls": ["--trusted-host=evil"]}, "extra_index_urls", "not a URL"),
        ({"extra_index_urls": ["ftp://mirror/simple"]}, "extra_index_urls", "not a URL"),
        ({"find_links": ["-e"]}, "find_links", "not a URL or an absolute path"),
        ({"find_links": ["wheels"]}, "find_links", "not a URL or an absolute path"),
        ({"parent_image": "python\n"}, "parent_image", "not a Docker image reference"),
        ({"environment": {"BAD\n": "x"}}, "environment", "not an environment variable name"),
        ({"environment": {"GOOD": "a\x00b"}}, "environment['GOOD']", "values must be strings"),
    ],
)
def test_invalid_input_names_field_value_and_accepted_forms(kwargs, field, fragment):
    with pytest.raises(InvalidSettingError) as info:
        ImageSettings(**kwargs)
    assert info.value.field == field
    assert f"ImageSettings: {field}=" in str(info.value)
    assert fragment in str(info.value)


@pytest.mark.parametrize(
    "reference",
    [
        "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime",
        "nvcr.io/nvidia/pytorch:24.10-py3",
        "localhost:5000/team/trainer@sha256:" + "a" * 64,
        "python",
    ],
)
def test_valid_image_references(reference):
    assert ImageSettings(parent_image=reference).parent_image == reference


def test_index_credentials_are_seen_in_any_index_url():
    assert not ImageSettings(index_url="https://pypi.example/simple", find_links=["/opt/wheels"]).index_credentials
    assert ImageSettings(index_url="https://user:token@pypi.example/simple").index_credentials
    assert ImageSettings(extra_index_urls=["https://token@pypi.example/simple"]).index_credentials
    assert ImageSettings(find_links=["https://u:p@wheels.example/"]).index_credentials

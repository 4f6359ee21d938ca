"""A derived image's recipe and spec (pure): the install container's commands, what the image adds, the tag."""

from __future__ import annotations

import dataclasses
import json

import pytest

from airflow_gpu_provider.backends.docker.images.recipe import (
    BUILD_DIR,
    CA_PATH,
    DEPS_DIR,
    SHARE,
    UV_PATH,
    extended,
    image_environment,
    install_commands,
)
from airflow_gpu_provider.backends.docker.images.spec import BuildOptions, derived_image_spec
from airflow_gpu_provider.exceptions import InvalidSettingError
from airflow_gpu_provider.settings import ImageSettings

PARENT = "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime"


def test_uv_from_the_worker():
    image = ImageSettings(requirements=["numpy>=1.26"], index_url="https://mirror/simple")
    (install,) = install_commands(image, uv_source="worker", uv_version="0.13.8", find_links=[])
    assert install[:3] == [UV_PATH, "pip", "install"]
    assert install[-3:] == ["--index-url", "https://mirror/simple", "numpy>=1.26"]
    assert "--system" in install
    assert "--compile-bytecode" in install  # .pyc files in the image, as pip makes them
    assert image_environment(uv_source="worker", uv_version="0.13.8", ca_bundle=False, installed=False) == {
        "PIP_BREAK_SYSTEM_PACKAGES": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_ROOT_USER_ACTION": "ignore",
        "UV_SYSTEM_CERTS": "1",
    }  # fmt: skip


def test_uv_through_pip_installs_the_workers_uv_version_first_but_not_on_a_base():
    image = ImageSettings(requirements=["six"])
    first, install = install_commands(image, uv_source="pip", uv_version="0.9.0", find_links=[])
    assert first[-1] == "uv==0.9.0"
    assert install[:4] == ["python3", "-m", "uv", "pip"]
    assert install_commands(image, uv_source="pip", uv_version="0.9.0", find_links=[], on_base=True) == [install]
    assert "UV_NATIVE_TLS" in image_environment(uv_source="pip", uv_version="0.9.0", ca_bundle=False, installed=False)


def test_pip_installer_with_ca_bundle_and_local_wheels():
    image = ImageSettings(requirements=["torch==2.13.0"], python_package_installer="pip")
    (install,) = install_commands(image, uv_source=None, uv_version="0.13.8", find_links=[f"{SHARE}/find-links-0"])
    assert install == [
        "python3", "-m", "pip", "install", "--no-cache-dir", "--find-links", f"{SHARE}/find-links-0", "torch==2.13.0",
    ]  # fmt: skip
    environment = image_environment(uv_source=None, uv_version="0.13.8", ca_bundle=True, installed=False)
    assert environment["SSL_CERT_FILE"] == CA_PATH and not [name for name in environment if "UV" in name]


def test_bytecode_compilation_can_be_turned_off():
    for installer, source, flag in (("uv", "worker", "--compile-bytecode"), ("pip", None, "--no-compile")):
        image = ImageSettings(requirements=["six"], python_package_installer=installer)
        common = {"uv_source": source, "uv_version": "0.13.8", "find_links": []}
        (compiled,) = install_commands(image, **common)
        (plain,) = install_commands(image, compile_bytecode=False, **common)
        assert (flag in compiled) == (installer == "uv")
        assert (flag in plain) == (installer == "pip")


def test_the_image_extends_its_parents_path_and_keeps_the_rest():
    parent = ["PATH=/usr/bin:/bin", "LANG=C.UTF-8", "PIP_ROOT_USER_ACTION=warn"]
    added = image_environment(uv_source=None, uv_version="1", ca_bundle=False, installed=True)
    result = dict(entry.split("=", 1) for entry in extended(parent, added))
    assert result["PATH"] == f"{DEPS_DIR}/bin:/usr/bin:/bin" and result["PYTHONPATH"] == DEPS_DIR
    assert result["LANG"] == "C.UTF-8" and result["PIP_ROOT_USER_ACTION"] == "ignore"


def test_spec_copies_local_wheel_dirs_and_keeps_urls(build_inputs):
    (build_inputs / "pkg-1.0-py3-none-any.whl").write_bytes(b"x")
    image = ImageSettings(requirements=["pkg"], find_links=[str(build_inputs), "https://wheels.example.com/"])
    spec = derived_image_spec(PARENT, image, BuildOptions(), uv_binary="/usr/bin/uv")
    assert spec.files == (("find-links-0", str(build_inputs)),)
    (install,) = spec.steps.commands
    assert install[-5:] == (
        "--find-links",
        f"{SHARE}/find-links-0",
        "--find-links",
        "https://wheels.example.com/",
        "pkg",
    )
    assert not spec.steps.installed and spec.steps.install_environment == spec.steps.environment
    assert spec.uv_binary == "/usr/bin/uv"


def test_tag_is_a_content_hash(build_inputs):
    tmp_path = build_inputs
    wheel = tmp_path / "pkg-1.0-py3-none-any.whl"
    wheel.write_bytes(b"x")
    image = ImageSettings(requirements=["pkg"], find_links=[str(tmp_path)])
    spec = derived_image_spec(PARENT, image, BuildOptions(), uv_binary=None)
    again = derived_image_spec(PARENT, image, BuildOptions(), uv_binary=None)
    tag = spec.tag_for("sha256:aaa")
    assert tag.startswith("airflow-gpu-derived:") and len(tag.split(":")[1]) == 16
    assert again.tag_for("sha256:aaa") == tag
    assert spec.tag_for("sha256:bbb") != tag  # the parent image changed
    pip = derived_image_spec(
        PARENT,
        ImageSettings(requirements=["pkg"], find_links=[str(tmp_path)], python_package_installer="pip"),
        BuildOptions(),
        uv_binary=None,
    )
    assert pip.tag_for("sha256:aaa") != tag  # the installer changed
    other = derived_image_spec(
        PARENT, ImageSettings(requirements=["pkg==2"], find_links=[str(tmp_path)]), BuildOptions(), uv_binary=None
    )
    assert other.tag_for("sha256:aaa") != tag  # the requirements changed
    wheel.write_bytes(b"xy")
    assert (
        derived_image_spec(PARENT, image, BuildOptions(), uv_binary=None).tag_for("sha256:aaa") != tag
    )  # a wheel changed


def test_registry_prefixes_the_name():
    spec = derived_image_spec(
        PARENT, ImageSettings(requirements=["six"]), BuildOptions(registry="reg.example.com/ml/"), uv_binary=None
    )
    assert spec.tag_for("x").startswith("reg.example.com/ml/airflow-gpu-derived:")


def test_missing_local_inputs_are_clear_errors(build_inputs):
    tmp_path = build_inputs
    with pytest.raises(InvalidSettingError, match="no such directory"):
        derived_image_spec(
            PARENT,
            ImageSettings(requirements=["x"], find_links=[str(tmp_path / "nope")]),
            BuildOptions(),
            uv_binary=None,
        )
    with pytest.raises(InvalidSettingError, match="ca_bundle"):
        derived_image_spec(
            PARENT, ImageSettings(requirements=["x"]), BuildOptions(ca_bundle=str(tmp_path / "ca.pem")), uv_binary=None
        )
    with pytest.raises(InvalidSettingError, match="absolute"):
        derived_image_spec(
            PARENT, ImageSettings(requirements=["x"], find_links=["wheels"]), BuildOptions(), uv_binary=None
        )


def test_credentials_go_to_the_install_container_only_never_to_the_image():
    image = ImageSettings(requirements=["private-pkg==1"], index_url="https://alice:s3cret@pypi.corp/simple")
    spec = derived_image_spec(PARENT, image, BuildOptions(), uv_binary="/usr/bin/uv")
    steps = spec.steps
    assert "s3cret" not in steps.text() and "alice" not in steps.text() and "s3cret" not in spec.fingerprint
    assert spec.netrc == "machine pypi.corp login alice password s3cret\n"
    assert steps.installed and spec.on_base is None and spec.recipe == ""  # never another image's base
    assert steps.commands == (
        ("python3", f"{BUILD_DIR}/runtime.pyz", "install", "--uv", f"{BUILD_DIR}/uv", DEPS_DIR, "uv", "--index-url",
         "https://pypi.corp/simple", "--", "private-pkg==1"),
        ("python3", "-m", "compileall", "-q", DEPS_DIR),
    )  # fmt: skip
    assert steps.entrypoint()[:2] == ["/bin/sh", "-c"] and " && python3 -m compileall" in steps.entrypoint()[2]
    assert dict(steps.install_environment)["NETRC"] == f"{BUILD_DIR}/netrc"
    assert "NETRC" not in dict(steps.environment) and dict(steps.environment)["PYTHONPATH"].startswith(DEPS_DIR)
    uncompiled = derived_image_spec(PARENT, image, BuildOptions(compile_bytecode=False), uv_binary="/usr/bin/uv")
    assert len(uncompiled.steps.commands) == 1 and uncompiled.steps.entrypoint()[0] == "python3"
    pip = derived_image_spec(
        PARENT, dataclasses.replace(image, python_package_installer="pip"), BuildOptions(), uv_binary=None
    )
    assert "--uv" not in pip.steps.commands[0] and "pip" in pip.steps.commands[0]
    through_pip = derived_image_spec(PARENT, image, BuildOptions(uv_source="pip"), uv_binary=None)
    assert through_pip.steps.commands[0][3:5] == ("--uv-version", through_pip.steps.commands[0][4])
    plain = derived_image_spec(PARENT, ImageSettings(requirements=["six"]), BuildOptions(), uv_binary=None)
    assert plain.netrc == "" and not plain.steps.installed and json.loads(plain.steps.text())["installed"] is False

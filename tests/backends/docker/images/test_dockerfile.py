from __future__ import annotations

import dataclasses
import json

import pytest

from airflow_gpu_provider.backends.docker.images.dockerfile import BuildOptions, derived_image_spec
from airflow_gpu_provider.backends.docker.images.recipe import BUILD_DIR, CA_PATH, SHARE, render_dockerfile, with_labels
from airflow_gpu_provider.exceptions import InvalidSettingError
from airflow_gpu_provider.settings import ImageSettings

PARENT = "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime"


def run_lines(dockerfile: str) -> list[list[str]]:
    return [json.loads(line[4:]) for line in dockerfile.splitlines() if line.startswith("RUN ")]


def test_uv_from_the_worker():
    text = render_dockerfile(
        PARENT,
        ImageSettings(requirements=["numpy>=1.26"], index_url="https://mirror/simple"),
        uv_source="worker",
        uv_version="0.13.8",
        ca_bundle=False,
        find_links=[],
    )
    lines = text.splitlines()
    assert lines[0] == f"FROM {PARENT}"
    assert "COPY uv /usr/local/bin/uv" in lines
    assert lines[1].endswith(" UV_SYSTEM_CERTS=1")
    (install,) = run_lines(text)
    assert install[:3] == ["/usr/local/bin/uv", "pip", "install"]
    assert install[-3:] == ["--index-url", "https://mirror/simple", "numpy>=1.26"]
    assert "--system" in install
    assert "--compile-bytecode" in install  # .pyc files in the image, as pip makes them


def test_uv_through_pip_installs_the_workers_uv_version():
    text = render_dockerfile(
        PARENT, ImageSettings(requirements=["six"]), uv_source="pip", uv_version="0.9.0", ca_bundle=False, find_links=[]
    )
    first, install = run_lines(text)
    assert first[-1] == "uv==0.9.0"
    assert install[:4] == ["python3", "-m", "uv", "pip"]
    assert " UV_NATIVE_TLS=1\n" in text


def test_pip_installer_with_ca_bundle_and_local_wheels():
    image = ImageSettings(requirements=["torch==2.13.0"], python_package_installer="pip")
    text = render_dockerfile(
        PARENT,
        image,
        uv_source=None,
        uv_version="0.13.8",
        ca_bundle=True,
        find_links=[f"{SHARE}/find-links-0"],
        wheel_dirs=["find-links-0"],
    )
    assert "uv" not in text.replace("UV", "")
    assert f"COPY ca-bundle.pem {CA_PATH}" in text
    assert f"SSL_CERT_FILE={CA_PATH}" in text
    assert f"COPY find-links-0 {SHARE}/find-links-0" in text
    (install,) = run_lines(text)
    assert install == [
        "python3",
        "-m",
        "pip",
        "install",
        "--no-cache-dir",
        "--find-links",
        f"{SHARE}/find-links-0",
        "torch==2.13.0",
    ]


def test_bytecode_compilation_can_be_turned_off():
    for installer, source, flag in (("uv", "worker", "--compile-bytecode"), ("pip", None, "--no-compile")):
        image = ImageSettings(requirements=["six"], python_package_installer=installer)
        common = {"uv_source": source, "uv_version": "0.13.8", "ca_bundle": False, "find_links": []}
        compiled = render_dockerfile(PARENT, image, **common)
        plain = render_dockerfile(PARENT, image, compile_bytecode=False, **common)
        assert (flag in compiled) == (installer == "uv")
        assert (flag in plain) == (installer == "pip")


def test_spec_copies_local_wheel_dirs_and_keeps_urls(build_inputs):
    (build_inputs / "pkg-1.0-py3-none-any.whl").write_bytes(b"x")
    image = ImageSettings(requirements=["pkg"], find_links=[str(build_inputs), "https://wheels.example.com/"])
    spec = derived_image_spec(PARENT, image, BuildOptions(), uv_binary="/usr/bin/uv")
    assert spec.files == (("find-links-0", str(build_inputs)),)
    assert f"--find-links {SHARE}/find-links-0".replace(" ", '", "') in spec.dockerfile
    assert "https://wheels.example.com/" in spec.dockerfile
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


def test_credentials_go_to_the_install_container_only_never_to_the_build():
    image = ImageSettings(requirements=["private-pkg==1"], index_url="https://alice:s3cret@pypi.corp/simple")
    spec = derived_image_spec(PARENT, image, BuildOptions(), uv_binary="/usr/bin/uv")
    assert "s3cret" not in spec.dockerfile and "alice" not in spec.dockerfile and "netrc" not in spec.dockerfile
    assert "s3cret" not in spec.fingerprint  # new credentials do not make a new image
    assert "s3cret" not in " ".join(spec.install) and "s3cret" not in json.dumps(spec.install_environment)
    assert spec.netrc == "machine pypi.corp login alice password s3cret\n"
    assert spec.install == (
        "python3", f"{BUILD_DIR}/runtime.pyz", "install", "--uv", f"{BUILD_DIR}/uv", "/opt/airflow-gpu/site-packages",
        "uv", "--index-url", "https://pypi.corp/simple", "--", "private-pkg==1",
    )  # fmt: skip
    assert dict(spec.install_environment)["NETRC"] == f"{BUILD_DIR}/netrc"
    assert spec.dockerfile.count("FROM ") == 1 and 'RUN ["/usr/local/bin/uv"' not in spec.dockerfile
    assert "COPY deps /opt/airflow-gpu/site-packages" in spec.dockerfile
    assert "ENV PYTHONPATH=/opt/airflow-gpu/site-packages" in spec.dockerfile
    assert spec.dockerfile.endswith('RUN ["python3", "-m", "compileall", "-q", "/opt/airflow-gpu/site-packages"]\n')
    uncompiled = derived_image_spec(PARENT, image, BuildOptions(compile_bytecode=False), uv_binary="/usr/bin/uv")
    assert "compileall" not in uncompiled.dockerfile
    pip = derived_image_spec(
        PARENT, dataclasses.replace(image, python_package_installer="pip"), BuildOptions(), uv_binary=None
    )
    assert "--uv" not in pip.install and "pip" in pip.install
    through_pip = derived_image_spec(PARENT, image, BuildOptions(uv_source="pip"), uv_binary=None)
    assert through_pip.install[3:5] == ("--uv-version", through_pip.install[4]) and through_pip.install[4][0].isdigit()
    plain = derived_image_spec(PARENT, ImageSettings(requirements=["six"]), BuildOptions(), uv_binary=None)
    assert plain.netrc == "" and plain.install == () and plain.dockerfile.count("FROM ") == 1


def test_the_builder_label_comes_right_after_from_and_is_no_part_of_the_tag():
    spec = derived_image_spec(PARENT, ImageSettings(requirements=["six"]), BuildOptions(), uv_binary=None)
    labelled = with_labels(spec.dockerfile, {"airflow-gpu-provider.builder": "host:1:2"})
    lines = labelled.splitlines()
    assert lines[0] == f"FROM {PARENT}" and lines[1] == 'LABEL airflow-gpu-provider.builder="host:1:2"'
    assert lines[2:] == spec.dockerfile.splitlines()[1:]

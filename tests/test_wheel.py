"""The sdist and wheel as `uv build` makes them (README "Installation"): what `pip install` of the wheel gets.

One build for the module (about 10 s: uv builds the sdist, then the wheel from it, as a release would).
"""

from __future__ import annotations

import ast
import configparser
import io
import subprocess
import sys
import tarfile
import zipfile
from email.parser import HeaderParser
from pathlib import Path

import pytest
from conftest import REPO
from packaging.requirements import Requirement

from airflow_gpu_provider.get_provider_info import get_provider_info
from airflow_gpu_provider.task import runtime_zip
from airflow_gpu_provider.version import __version__

PACKAGE = REPO / "airflow_gpu_provider"
DIST_INFO = f"airflow_gpu_provider-{__version__}.dist-info"
ENTRY_POINTS = {
    "apache_airflow_provider": {"provider_info": "airflow_gpu_provider.get_provider_info:get_provider_info"},
    "airflow.plugins": {"airflow_gpu_provider": "airflow_gpu_provider.plugin:GpuProviderPlugin"},
    "airflow.policy": {"airflow_gpu_provider": "airflow_gpu_provider.pools.policy"},
    "console_scripts": {"airflow-gpu-docker-authz": "airflow_gpu_provider.policy.authz.__main__:main"},
}


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "uv", "build", "--quiet", "--out-dir", str(out), str(REPO)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    assert sorted(p.name for p in out.iterdir() if p.name != ".gitignore") == [
        f"airflow_gpu_provider-{__version__}-py3-none-any.whl",
        f"airflow_gpu_provider-{__version__}.tar.gz",
    ]
    return out


@pytest.fixture(scope="module")
def wheel(dist: Path) -> zipfile.ZipFile:
    return zipfile.ZipFile(dist / f"airflow_gpu_provider-{__version__}-py3-none-any.whl")


def test_the_wheel_holds_every_file_of_the_package_and_nothing_else(wheel):
    source = {
        path.relative_to(REPO).as_posix()
        for path in PACKAGE.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    }
    packaged = {name for name in wheel.namelist() if not name.startswith(DIST_INFO + "/")}
    assert packaged == source
    assert "airflow_gpu_provider/launchers/accelerate_launch_options.json" in packaged  # package data


def test_the_runtime_archive_built_from_the_wheel_is_the_one_the_source_builds(wheel, tmp_path):
    """Every backend ships runtime.pyz, built on the worker from the installed runtime/ package."""
    wheel.extractall(tmp_path)
    archive = runtime_zip.build(tmp_path / "airflow_gpu_provider" / "runtime")
    assert archive == runtime_zip.build()
    names = zipfile.ZipFile(io.BytesIO(archive)).namelist()
    assert names[0] == "__main__.py" and "airflow_gpu_runtime/protocol.py" in names


def test_the_entry_points_name_what_the_wheel_holds(wheel):
    parser = configparser.ConfigParser()
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # names are case-sensitive
    parser.read_string(wheel.read(f"{DIST_INFO}/entry_points.txt").decode())
    assert {group: dict(parser[group]) for group in parser.sections()} == ENTRY_POINTS
    for group in ENTRY_POINTS.values():
        for target in group.values():
            module, _, attribute = target.partition(":")
            tree = ast.parse(wheel.read(module.replace(".", "/") + ".py"))
            if attribute:
                defined = {node.name for node in tree.body if isinstance(node, ast.FunctionDef | ast.ClassDef)}
                assert attribute in defined, target


def test_the_metadata_declares_the_license_version_and_requirements(wheel):
    metadata = HeaderParser().parsestr(wheel.read(f"{DIST_INFO}/METADATA").decode())
    assert (metadata["Name"], metadata["Version"]) == ("airflow-gpu-provider", __version__)
    assert get_provider_info()["versions"] == [__version__]
    assert (metadata["License-Expression"], metadata["License-File"]) == ("Apache-2.0", "LICENSE")
    assert wheel.read(f"{DIST_INFO}/licenses/LICENSE") == (REPO / "LICENSE").read_bytes()
    required = {r.name: r for r in map(Requirement, metadata.get_all("Requires-Dist")) if r.marker is None}
    assert set(required) == {"apache-airflow", "apache-airflow-providers-common-compat", "packaging", "uv"}
    airflow = required["apache-airflow"].specifier  # README "Airflow versions"
    assert [airflow.contains(v) for v in ("3.1.0", "3.1.1", "3.3.2", "4.0.0")] == [False, True, True, False]
    assert not any(r.name in ("torch", "docker", "kubernetes") for r in required.values())  # the extras' part


def test_the_sdist_holds_the_license_changelog_and_readme(dist):
    with tarfile.open(dist / f"airflow_gpu_provider-{__version__}.tar.gz") as sdist:
        names = {name.split("/", 1)[1] for name in sdist.getnames() if "/" in name}
    assert {"LICENSE", "CHANGELOG.md", "README.md", "pyproject.toml", "airflow_gpu_provider/__init__.py"} <= names
    assert not any(name.startswith(("tests/", "dags/", "docs/")) for name in names)


def test_a_missing_extra_is_named_with_packages_an_index_has():
    """No release is published yet, so the error names the packages the extra brings (from the installed metadata)."""
    from airflow_gpu_provider.exceptions import MissingDependencyError

    message = str(MissingDependencyError("The 'docker' backend (docker)", "docker"))
    assert message == (
        "The 'docker' backend (docker) is not installed. "
        "Install the provider's 'docker' extra: pip install 'apache-airflow-providers-docker>=4.0'"
    )
    assert str(MissingDependencyError("AccelerateOperator", "accelerate")).endswith(
        "pip install 'accelerate>=1.0' 'torch>=2.1'"
    )

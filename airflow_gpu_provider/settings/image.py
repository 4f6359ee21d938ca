"""``ImageSettings``: the software a task runs with, usable by every backend.

Local: a cached virtualenv with the requirements, layered over the worker's packages.
Docker: a derived image ``FROM parent_image`` with the requirements installed.
Kubernetes: the requirements installed by an init container, or the derived image from a registry.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import urlparse

from airflow_gpu_provider.dag_line import entry_point
from airflow_gpu_provider.exceptions import InvalidSettingError
from airflow_gpu_provider.settings.grammar import ENV_NAME, IMAGE_REFERENCE

#: The parent image of Docker and Kubernetes tasks whose connection's extra ``parent_image`` is unset
DEFAULT_PARENT_IMAGE = "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime"

Installer = Literal["uv", "pip"]
INSTALLERS: tuple[str, ...] = ("uv", "pip")
_OWNER = "ImageSettings"


#: the accepted forms of an image reference, for errors (a task's parent image, a connection's ``parent_image``)
IMAGE_FORMS = f"'[registry/]name[:tag][@sha256:digest]' in lower case, e.g. {DEFAULT_PARENT_IMAGE!r}"


def check_image_reference(value: object) -> None:
    """Refuse what is not a Docker image reference (``ValueError``, the reason)."""
    if not isinstance(value, str) or not IMAGE_REFERENCE.fullmatch(value):
        raise ValueError("not a Docker image reference")


def _invalid(name: str, value: object, reason: str, accepted: str | None = None) -> InvalidSettingError:
    return InvalidSettingError(_OWNER, name, value, reason, accepted)


def _string_tuple(name: str, value: object, accepted: str) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise _invalid(name, value, "expected a list of strings", accepted)
    for item in value:
        if not isinstance(item, str) or not item.strip():
            raise _invalid(name, item, "every item must be a non-empty string", accepted)
    return tuple(item.strip() for item in value)


def check_environment(owner: str, field_name: str, environment: object) -> dict[str, str]:
    """Environment variables: names of ``[A-Za-z_][A-Za-z0-9_]*``, string values without NUL."""
    if not isinstance(environment, Mapping):
        raise InvalidSettingError(owner, field_name, environment, "expected a mapping", "a dict of str to str")
    checked: dict[str, str] = {}
    for key, value in environment.items():
        if not isinstance(key, str) or not ENV_NAME.fullmatch(key):
            raise InvalidSettingError(
                owner, field_name, key, "not an environment variable name", "[A-Za-z_][A-Za-z0-9_]*"
            )
        if not isinstance(value, str) or "\x00" in value:
            raise InvalidSettingError(owner, f"{field_name}[{key!r}]", value, "values must be strings", "str")
        checked[key] = value
    return checked


def _check_location(name: str, value: str, *, paths: bool) -> None:
    """A package index URL (or, for ``find_links``, a local directory): never an installer option."""
    accepted = "an http(s) or file:// URL" + (", or an absolute directory path" if paths else "")
    if not isinstance(value, str) or not value.strip():
        raise _invalid(name, value, "expected a URL", accepted)
    if any(char.isspace() for char in value):  # "https://h/simple\n" or a pasted space: another URL than meant
        raise _invalid(name, value, "a URL holds no white space", accepted)
    try:
        parsed = urlparse(value)
    except ValueError as err:  # "https://[::1/simple": an unclosed IPv6 host
        raise _invalid(name, value, f"not a URL ({err})", accepted) from None
    if (parsed.scheme in ("http", "https") and parsed.netloc) or (parsed.scheme == "file" and parsed.path):
        return
    if paths and not parsed.scheme and value.startswith("/"):
        return
    raise _invalid(name, value, "not a URL" + (" or an absolute path" if paths else ""), accepted)


@dataclass(frozen=True, repr=False)
class ImageSettings:
    """Software environment of a task. Immutable; checked when built.

    :param parent_image: base image for Docker/Kubernetes (default: the Docker or Kubernetes connection's extra
        ``parent_image``, else :data:`DEFAULT_PARENT_IMAGE`). The local backend runs on the worker's own Python.
    :param requirements: extra PEP 508 requirements, e.g. ``["transformers==4.46.0", "datasets>=3"]``
    :param python_package_installer: ``"uv"`` (default, fast) or ``"pip"``
    :param environment: environment variables for the task process
    :param index_url: package index replacing PyPI (air-gapped mirrors)
    :param extra_index_urls: more package indexes
    :param find_links: local wheel directories or URLs to search first
    """

    parent_image: str | None = None
    requirements: tuple[str, ...] = ()
    python_package_installer: Installer = "uv"
    environment: Mapping[str, str] = field(default_factory=dict)
    index_url: str | None = None
    extra_index_urls: tuple[str, ...] = ()
    find_links: tuple[str, ...] = ()

    @entry_point()
    def __post_init__(self) -> None:
        def put(name: str, value: Any) -> None:
            object.__setattr__(self, name, value)

        if self.parent_image is not None:
            try:
                check_image_reference(self.parent_image)
            except ValueError as err:
                raise _invalid("parent_image", self.parent_image, str(err), IMAGE_FORMS) from None

        requirements = _string_tuple("requirements", self.requirements, "a list of PEP 508 strings")
        if requirements:  # packaging costs a few ms: only for tasks that inject requirements
            from packaging.requirements import InvalidRequirement, Requirement
        normalized = []
        for text in requirements:
            try:
                normalized.append(str(Requirement(text)))
            except InvalidRequirement as err:
                raise _invalid(
                    "requirements",
                    text,
                    f"not a PEP 508 requirement ({str(err).splitlines()[0]})",
                    "PEP 508 strings such as 'numpy>=1.26', 'torch==2.5.1', 'pkg[extra]; python_version>=\"3.10\"'",
                ) from None
        put("requirements", tuple(normalized))

        if self.python_package_installer not in INSTALLERS:
            raise _invalid(
                "python_package_installer",
                self.python_package_installer,
                "unknown installer",
                " or ".join(map(repr, INSTALLERS)),
            )

        put("environment", check_environment(_OWNER, "environment", self.environment))

        if self.index_url is not None:
            _check_location("index_url", self.index_url, paths=False)
        put("extra_index_urls", _string_tuple("extra_index_urls", self.extra_index_urls, "a list of URLs"))
        for url in self.extra_index_urls:
            _check_location("extra_index_urls", url, paths=False)
        put("find_links", _string_tuple("find_links", self.find_links, "a list of directories or URLs"))
        for link in self.find_links:
            _check_location("find_links", link, paths=True)

    def __repr__(self) -> str:
        """The settings, the credentials of their URLs redacted (a repr reaches logs and the serialized DAG)."""
        from airflow_gpu_provider.runtime.protocol import redact

        fields = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in dataclasses.fields(self))
        return redact(f"ImageSettings({fields})")

    @property
    def install_options(self) -> dict[str, Any]:
        """Everything that decides what gets installed, in a stable order, without the credentials of any URL.

        It keys cached venvs and derived images (and their labels): a rotated token must not rebuild them, and no
        digest of a secret goes into a label.
        """
        from airflow_gpu_provider.runtime.protocol import redact  # the one redaction; not on the DAG-parse path

        return {
            "requirements": sorted(redact(requirement) for requirement in self.requirements),
            "installer": self.python_package_installer,
            "index_url": redact(self.index_url) if self.index_url else None,
            "extra_index_urls": [redact(url) for url in self.extra_index_urls],
            "find_links": [redact(link) for link in self.find_links],
        }

    @property
    def requirements_hash(self) -> str:
        """Content hash of :attr:`install_options` (12 hex digits); ``"none"`` without requirements."""
        if not self.requirements:
            return "none"
        blob = json.dumps(self.install_options, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:12]

    @property
    def index_credentials(self) -> bool:
        """Whether an index or find-links URL carries credentials (``https://user:token@host/...``)."""
        from urllib.parse import urlsplit

        urls = [self.index_url or "", *self.extra_index_urls, *self.find_links]
        return any("://" in url and urlsplit(url).username is not None for url in urls)

    def installer_index_args(self) -> list[str]:
        """Index arguments understood by both ``uv pip install`` and ``pip install``."""
        args: list[str] = []
        if self.index_url:
            args += ["--index-url", self.index_url]
        for url in self.extra_index_urls:
            args += ["--extra-index-url", url]
        for link in self.find_links:
            args += ["--find-links", link]
        return args

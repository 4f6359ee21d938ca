"""Fuzz corpus: what a DAG author may write, against what the provider promises about it.

For EVERY generated case: either the settings (or the operator) are accepted, and then what the task would submit is
valid, or construction raises :class:`InvalidSettingError` (or a subclass) whose message names the offending field.
No other exception type may escape. "Valid" means:

- Kubernetes: every rendered object passes ``kubernetes-validate`` (strict, oldest and newest schemas) and the
  restricted pod security profile (``tests/backends/kubernetes/k8s_manifests.validate``), and its tolerations obey
  the API server's rules;
- Docker: the plan's container arguments build docker-py's ``HostConfig``, ``ContainerConfig`` and ``Mount`` objects
  (what ``create_container`` sends), for the GPU and the CPU-fallback container alike, with mounts the engine takes
  (absolute targets, not ``/``, not twice, not the provider's own ``/airflow-gpu``; no source for ``tmpfs``; a boolean
  ``read_only``) and an absolute working directory;
- local (and the ``[gpu] backend`` default): the task's request resolves when the task starts.

Every accepted Kubernetes case is rendered and validated (no sampling). Templated values are checked when rendered,
as the operator documents: for them an ``InvalidSettingError`` at render time is the accepted refusal. Generated free
text holds no Jinja markup (a malformed template is Airflow's own error). The free-form Kubernetes API dicts
(``affinity``, ``pod_template_dict``, ``container_security_context``) are passed through as documented; they are
fuzzed with bad shapes and profile-breaking values, not with wrongly typed API fields, which the API server judges.

Cases (``max_examples``, derandomized, no example database, so CI runs the same cases every time):
ResourceSettings 1200 + ImageSettings 800 + Kubernetes operator 1500 + Docker operator 1000 + any backend 600 +
callable arguments 400 + the Docker engine's authorization plugin 1500 (any create body a DAG file's own code may
send the engine) = 7000 generated cases under ``make fuzz`` (about 35 s on 2 cores), a tenth in ``make test``, plus the
``@example`` regressions of the bugs this corpus found.
"""

from __future__ import annotations

import dataclasses
import grp
import json
import math
import os
import posixpath
import pwd
import re
from collections import Counter
from collections.abc import Iterator, Mapping
from decimal import Decimal
from fractions import Fraction
from typing import Any

import docker.constants
import docker.types
import pytest
from backends.kubernetes.k8s_manifests import validate
from helpers import fuzz_cases
from hypothesis import HealthCheck, currently_in_test_context, event, example, given, settings
from hypothesis import strategies as st

from airflow_gpu_provider.config.worker import GpuConfig
from airflow_gpu_provider.exceptions import InvalidSettingError, UnknownSettingError
from airflow_gpu_provider.operators.gpu_step import GpuStepOperator
from airflow_gpu_provider.render import stand_in
from airflow_gpu_provider.runtime.protocol import redact
from airflow_gpu_provider.settings import (
    AMD,
    NVIDIA,
    Accelerator,
    GpuVendor,
    ImageSettings,
    MigProfile,
    ResourceSettings,
)
from airflow_gpu_provider.settings.units import MAX_BYTES, MAX_CPUS, MIN_CPUS

FUZZ = settings(
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)
RESOURCE_FIELDS = frozenset(f.name for f in dataclasses.fields(ResourceSettings))
IMAGE_FIELDS = frozenset(f.name for f in dataclasses.fields(ImageSettings))
DOCKER_CONTAINER_DIR = "/airflow-gpu"
NAN, INF = float("nan"), float("inf")
# Generated cases of each property (max_examples): 7000 in all under `make fuzz`, a tenth in `make test`.
DEEP = {"resources": 1200, "image": 800, "kubernetes": 1500, "docker": 1000, "any_backend": 600, "arguments": 400,
        "authz": 1500}  # fmt: skip
CASES = {name: fuzz_cases(deep) for name, deep in DEEP.items()}


# ---------------------------------------------------------------------------------------------- values
class Opaque:
    """Not a number, not a string, not a container: what a typo or a wrong variable passes."""

    def __repr__(self) -> str:
        return "Opaque()"


WRONG_TYPES = st.sampled_from(
    [
        [],
        {},
        (),
        (1,),
        [1],
        {"a": 1},
        b"16",
        bytearray(b"1"),
        Opaque(),
        True,
        False,
        1j,
        Decimal("NaN"),
        Decimal("1e400"),
        Fraction(1, 3),
        {1, 2},
        frozenset(),
        range(2),
        print,
    ]
)
FLOATS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([NAN, INF, -INF, 0.0, -0.0, 1e-300, 5e-324, 1e308, 1e-4, 0.0005, 0.5, 1.5, 2.0, 1024.0, 1025.0]),
)
INTS = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.integers(min_value=-3, max_value=64),
    st.sampled_from([2**31, 2**63, 2**64 + 1, -(2**63), 10**400, 1024, 1025, 65536, 65537, 6 * 2**20, 2**50 + 1]),
)
NUMBER_TEXT = st.sampled_from(
    [
        "２",
        "٣",
        "¹",
        "²",
        "①",
        "٣Gi",
        "１６Gi",
        "1\n",
        "4\n",
        " 2 ",
        "\t8\t",
        "16Gi\n",
        "16\u00a0Gi",
        "16 Gi",
        "1e400",
        "1e-400",
        "1e400Gi",
        "16XB",
        "16Xi",
        "16gb",
        "16GiB",
        "16gib",
        "16Gb",
        "16k",
        "16K",
        "16Ki",
        "16m",
        "500m",
        "0.5",
        ".5",
        "5.",
        "+2",
        "-2",
        "0",
        "00",
        "0x10",
        "1_000",
        "1,5",
        "Infinity",
        "inf",
        "NaN",
        "nan",
        "",
        " ",
        "\n",
        "all",
        "ALL",
        " all",
        "all\n",
        "1.5Gi",
        "0.1",
        "1e3",
        "1E3",
        "1e3Gi",
        "7Mi",
        "6Mi",
        "5Mi",
        "1Mi",
        "1Ki",
        "1Pi",
        "1Ei",
        "2Pi",
        "1024Ti",
        "1025Ti",
        "9" * 400,
        "1" + "0" * 30,
        "65536",
        "65537",
        "0.001",
        "0.0009",
        "1m",
        "0.5m",
        "1024",
        "1025",
        "１",
        "𝟙",
        "\u0663",
        "1\x00",
        "1/2",
    ]
)
# Free text, but never Jinja markup: templated fields render it with Airflow, whose syntax errors are Airflow's.
ANY_TEXT = st.text(max_size=24).filter(lambda text: not any(mark in text for mark in ("{{", "{%", "{#")))
HOSTILE = st.one_of(st.none(), INTS, FLOATS, NUMBER_TEXT, ANY_TEXT, WRONG_TYPES)


def field(valid: st.SearchStrategy[Any], *bad: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Seven times in eight a value of the field's own kind (meant to be accepted); else a bad one, or anything."""
    wrong = st.integers(0, 3).flatmap(lambda i: HOSTILE if i == 0 or not bad else st.one_of(*bad))
    return st.integers(0, 7).flatmap(lambda i: wrong if i == 0 else valid)


def some_of(values: Mapping[str, st.SearchStrategy[Any]]) -> st.SearchStrategy[dict[str, Any]]:
    """A dict with any subset of the keys (each with a value of its strategy)."""
    return st.fixed_dictionaries({}, optional=dict(values))


def a_few(values: Mapping[str, st.SearchStrategy[Any]], most: int) -> st.SearchStrategy[dict[str, Any]]:
    """A dict with up to ``most`` of the keys."""
    keys = st.lists(st.sampled_from(sorted(values)), max_size=most, unique=True)
    return keys.flatmap(lambda chosen: st.fixed_dictionaries({key: values[key] for key in chosen}))


def quantity() -> st.SearchStrategy[str]:
    suffixes = st.sampled_from(
        [
            "",
            "Ki",
            "Mi",
            "Gi",
            "Ti",
            "Pi",
            "Ei",
            "k",
            "K",
            "M",
            "G",
            "T",
            "P",
            "E",
            "m",
            "KB",
            "MB",
            "GB",
            "TB",
            "KiB",
            "MiB",
            "GiB",
            "b",
            "B",
            "gb",
            "mib",
            "XB",
            "x",
        ]
    )
    numbers = st.one_of(
        st.integers(0, 10**6).map(str),
        st.decimals(allow_nan=False, allow_infinity=False, places=3, min_value=0, max_value=10**5).map(str),
        st.sampled_from(["1e3", "2E2", "1e400", ".5", "5.", "0.0005"]),
    )
    return st.builds(lambda n, s, pad: f"{pad}{n}{s}{pad}", numbers, suffixes, st.sampled_from(["", " ", "\n"]))


SECONDS = field(st.one_of(st.integers(1, 3600), st.floats(0.1, 1e5)), FLOATS)
BYTES_OK = st.sampled_from(["16Gi", "512Mi", "16GB", "1Ti", "8G", "100Mi", "2GiB", "1.5Gi", "64Mi", "4096Mi"])

# ResourceSettings
ACCELERATOR_BAD = st.one_of(
    st.builds(
        lambda m, sep, n: f"{m}{sep}{n}",
        st.sampled_from(["A100", "H100-80GB", "L4", "t4", "MI300X", "TRAINIUM", "TPU-V5E", "RTX-4090", "a100"]),
        st.sampled_from([":", "::", " :"]),
        st.one_of(st.integers(-2, 1100).map(str), NUMBER_TEXT),
    ),
    st.sampled_from(["A100\n", " A100", "A100:", ":2", "A 100", "A100/2", "ä100", "Ａ100", "gpu.x_y-z", "-A100"]),
)
CUSTOM_VENDOR = GpuVendor("acme", "acme.example.com/npu", "ACME_VISIBLE_DEVICES")
RESOURCE_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "cpu_count": field(
        st.one_of(
            st.integers(1, 64), st.floats(0.001, 512), st.sampled_from(["500m", "2", "0.5", "250m", "1.5", " 4 "])
        ),
        quantity(),
        NUMBER_TEXT,
        FLOATS,
        INTS,
    ),
    "gpu_count": field(st.one_of(st.integers(0, 8), st.sampled_from(["all", "2", "8", 2.0])), INTS, NUMBER_TEXT),
    "memory": field(st.one_of(st.integers(6 * 2**20, 2**40), BYTES_OK), quantity(), NUMBER_TEXT, INTS),
    "shm_size": field(st.one_of(st.integers(2**20, 2**36), BYTES_OK), quantity(), NUMBER_TEXT, INTS),
    "accelerator": field(
        st.one_of(
            st.sampled_from(list(Accelerator)),
            st.sampled_from(["A100:2", "H100:8", "L4", "T4:1", "A100-80GB", "RTX-4090", "TPU-V5E:4", "MI300X"]),
        ),
        ACCELERATOR_BAD,
    ),
    "gpu_vendor": field(
        st.sampled_from(["nvidia", "NVIDIA", "amd", "intel", "aws-neuron", "google-tpu", NVIDIA, AMD, CUSTOM_VENDOR]),
        st.sampled_from([" nvidia", "nvidia\n", "ati", "", "NVİDIA"]),
    ),
    "mig_profile": field(
        st.one_of(st.sampled_from(list(MigProfile)), st.sampled_from(["1g.10gb", "1g.10gb+me"])),
        st.sampled_from(
            [
                "1g.10gb\n",
                "0g.10gb",
                "1g.0gb",
                "1G.10GB",
                "١g.10gb",
                "1g.10gb ",
                "1g.10gb.",
                "99999999999999999999g.1gb",
                "all",
            ]
        ),
    ),
}

# ImageSettings
IMAGES = field(
    st.sampled_from(
        [
            "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime",
            "python:3.12-slim",
            "localhost:5000/team/x:1",
            "registry.example.com/a/b@sha256:" + "a" * 64,
            "ubuntu",
            "ghcr.io/x/y:v1.2.3",
        ]
    ),
    st.sampled_from(
        [
            "Ubuntu",
            "ubuntu:",
            "ubuntu:latest\n",
            "ubuntu:" + "t" * 129,
            "-ubuntu",
            "ubuntu//x",
            "ubuntu@sha256:abc",
            "ubuntu;rm -rf /",
            "ubuntu latest",
            "ｕbuntu",
            "",
            " ",
        ]
    ),
)
GOOD_REQUIREMENT = st.sampled_from(
    [
        "numpy>=1.26",
        "torch==2.5.1",
        "transformers[torch]==4.46.0",
        "pkg; python_version>='3.10'",
        " numpy ",
        "pkg @ https://example.com/pkg-1.0-py3-none-any.whl",
        "numpy>=1.26\n",
        "scikit-learn~=1.5",
    ]
)
BAD_REQUIREMENT = st.one_of(
    st.sampled_from(
        [
            "numpy=1.0",
            "numpy>=",
            "-e .",
            "--index-url https://evil.example.com",
            "-r requirements.txt",
            "numpy; rm",
            "./local/path",
            "numpy==1.0 --hash=sha256:abc",
            "na me",
            "ñumpy",
            "numpy[",
            "numpy\x00",
            "",
            " ",
            "numpy\nscipy",
            "a" * 300,
            "pkg @ https://user:token@example.com/p.whl",
        ]
    ),
    ANY_TEXT,
)
REQUIREMENTS = field(
    st.one_of(st.lists(GOOD_REQUIREMENT, max_size=3), st.lists(GOOD_REQUIREMENT, max_size=2).map(tuple)),
    st.lists(st.one_of(GOOD_REQUIREMENT, BAD_REQUIREMENT), min_size=1, max_size=3),
    GOOD_REQUIREMENT,
)
GOOD_URL = st.sampled_from(
    [
        "https://pypi.example.com/simple",
        "http://mirror:8080/simple/",
        "https://user:pass@pypi.example.com/simple",
        "https://__token__:pypi-abc@example.com/simple",
        "https://user@example.com/simple",
        " https://x.example.com ",
        "https://x.example.com/simple\n",
    ]
)
GOOD_LINK = st.one_of(GOOD_URL, st.sampled_from(["file:///srv/wheels", "/srv/wheels"]))
BAD_LOCATION = st.one_of(
    st.sampled_from(
        [
            "srv/wheels",
            "--no-index",
            "--index-url=https://x",
            "-f /x",
            "https://",
            "http://",
            "file://",
            "ftp://x.example.com",
            "https://x y.example.com",
            "https://[::1/simple",
            "https://example.com:99999/simple",
            "",
            " ",
            "file:///srv/wheels",
            "/srv/wheels",
        ]
    ),
    ANY_TEXT,
)
GOOD_ENV_KEY = st.sampled_from(
    [
        "HF_HOME",
        "X",
        "_",
        "CUDA_VISIBLE_DEVICES",
        "NVIDIA_VISIBLE_DEVICES",
        "OMP_NUM_THREADS",
        "AIRFLOW_GPU_ENVELOPE",
        "PYTHONUNBUFFERED",
        "HOME",
        "a1",
    ]
)
BAD_ENV_KEY = st.one_of(
    st.sampled_from(["1X", "A-B", "A.B", "A B", "", "Ä", "X\n", "A=B", 1, None, ("A",), b"A", 1.5, True]), ANY_TEXT
)
GOOD_ENV_VALUE = st.one_of(ANY_TEXT, st.sampled_from(["", "line\nbreak", "$(id)", "'; rm -rf /", "日本語", "x" * 1000]))
BAD_ENV_VALUE = st.sampled_from(["a\x00b", 1, None, 1.5, True, b"x", ["a"], {"a": "b"}, Opaque()])
ENVIRONMENT = field(
    st.dictionaries(GOOD_ENV_KEY, GOOD_ENV_VALUE, max_size=4),
    st.dictionaries(
        st.one_of(GOOD_ENV_KEY, BAD_ENV_KEY), st.one_of(GOOD_ENV_VALUE, BAD_ENV_VALUE), min_size=1, max_size=3
    ),
    st.lists(st.tuples(GOOD_ENV_KEY, GOOD_ENV_VALUE), min_size=1, max_size=2),
)
IMAGE_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "parent_image": IMAGES,
    "requirements": REQUIREMENTS,
    "python_package_installer": field(st.sampled_from(["uv", "pip"]), st.sampled_from(["UV", "pip3", "conda", "uv\n"])),
    "environment": ENVIRONMENT,
    "index_url": field(GOOD_URL, BAD_LOCATION),
    "extra_index_urls": field(
        st.lists(GOOD_URL, max_size=2), st.lists(st.one_of(GOOD_URL, BAD_LOCATION), min_size=1, max_size=2), GOOD_URL
    ),
    "find_links": field(
        st.lists(GOOD_LINK, max_size=2), st.lists(st.one_of(GOOD_LINK, BAD_LOCATION), min_size=1, max_size=2), GOOD_LINK
    ),
}


# ---------------------------------------------------------------------------------------------- backend options
GOOD_MOUNT = st.one_of(
    st.builds(
        lambda s, t, ro: {"source": s, "target": t, "type": "bind", "read_only": ro},
        st.sampled_from(["/data", "/models/llama", "/tmp/x", "/etc/ssl/certs", "/srv/ds"]),
        st.sampled_from(["/data", "/models", "/mnt/a", "/workspace/x"]),
        st.booleans(),
    ),
    st.builds(
        lambda s, t: {"source": s, "target": t, "type": "volume"},
        st.sampled_from(["hf-cache", "vol_1"]),
        st.sampled_from(["/cache", "/root/.cache/huggingface"]),
    ),
    st.builds(lambda t: {"target": t, "type": "tmpfs"}, st.sampled_from(["/scratch", "/tmp/t"])),
    st.builds(lambda s, t: {"source": s, "target": t}, st.sampled_from(["/data", "/srv/ds"]), st.just("/in")),
)
_PATHS = st.sampled_from(
    [
        "/data",
        "/data/",
        "/var/run/docker.sock",
        "/var/run",
        "//var/run/docker.sock",
        "/run/containerd/containerd.sock",
        "/var/lib/docker",
        "/etc",
        "/usr/share",
        "/proc",
        "/sys/fs",
        "/dev",
        "/",
        "/root/.ssh",
        "/home/u/../../etc",
        "/x/docker.sock",
        "data",
        "./data",
        "",
        "/data\x00x",
        "/a:b",
        "/airflow-gpu",
        "/airflow-gpu/",
        "/airflow-gpu/x",
        "/dev/shm",
        "/tmp/airflow-gpu-result.json",
        "C:\\data",
        "/data/../",
    ]
)
BAD_MOUNT = st.one_of(
    st.fixed_dictionaries(
        {"target": st.one_of(_PATHS, HOSTILE)},
        optional={
            "source": st.one_of(_PATHS, st.sampled_from(["hf-cache", "my volume"]), HOSTILE),
            "type": st.one_of(st.sampled_from(["bind", "volume", "tmpfs", "npipe", "BIND", "cluster"]), HOSTILE),
            "read_only": st.one_of(st.booleans(), st.sampled_from(["false", "true", 0, 1, "no", None])),
            "propagation": st.just("rshared"),
        },
    ),
    WRONG_TYPES,
)
DOCKER_OPTIONS: dict[str, st.SearchStrategy[Any]] = {
    "mounts": field(
        st.lists(GOOD_MOUNT, max_size=3), st.lists(st.one_of(GOOD_MOUNT, BAD_MOUNT), min_size=1, max_size=3), GOOD_MOUNT
    ),
    "devices": field(
        st.lists(st.one_of(st.integers(0, 8), st.sampled_from(["0", "GPU-abc", "MIG-1"])), min_size=1, max_size=4),
        st.lists(st.sampled_from([-1, " ", "1\n", True, None, "", "0,1"]), max_size=3),
    ),
    "user": field(st.sampled_from(["1000", 1000, "1000:1000", "nobody"]), st.sampled_from([0, "", " ", "u\nv", True])),
    "working_dir": field(
        st.sampled_from(["/work", "/tmp", "/workspace/x"]), st.sampled_from(["/", "work", "./w", "", "/w\x00", "~/w"])
    ),
    "network_mode": field(st.sampled_from(["bridge", "none", "host", "my-net"]), st.just("")),
    "ipc_mode": field(
        st.sampled_from(["host", "private", "shareable", "none"]), st.sampled_from(["bogus", "", "container:"])
    ),
    "cap_add": field(
        st.lists(st.sampled_from(["SYS_PTRACE", "IPC_LOCK", "NET_ADMIN"]), min_size=1, max_size=2),
        st.lists(st.sampled_from(["sys_ptrace", "CAP_SYS_ADMIN", "ALL", "", "SYS-PTRACE", "ＳＹＳ"]), max_size=2),
    ),
    "group_add": field(
        st.lists(st.sampled_from(["video", "render", 44]), min_size=1, max_size=2),
        st.lists(st.sampled_from(["", True, None, -1]), max_size=2),
    ),
    "driver_capabilities": field(st.sampled_from(["compute,utility", "all", "compute"]), st.just("")),
    "timeout": SECONDS,
    "stop_timeout": SECONDS,
    "auto_remove": field(st.sampled_from(["force", "success", "never"]), st.just(True)),
    "pull": field(st.sampled_from(["missing", "always", "never"]), st.just("Always")),
    "compile_bytecode": field(st.booleans()),
    "mount_tmp_dir": field(st.booleans()),
    "uv_source": field(st.sampled_from(["worker", "pip"])),
    "repository": field(st.sampled_from(["airflow-gpu-derived", "team/x"]), st.just("UPPER")),
    "docker_url": field(st.sampled_from(["unix://var/run/docker.sock", "tcp://h:2376", ["tcp://a", "tcp://b"]])),
}
GOOD_LABEL_KEY = st.sampled_from(["team", "example.com/team", "app.kubernetes.io/part-of", "a" * 63, "x_y.z-1"])
BAD_LABEL_KEY = st.one_of(
    st.sampled_from(
        [
            "a" * 64,
            "x." * 130 + "io/name",
            "a" * 254 + "/n",
            "example.com/" + "n" * 64,
            "Example.com/team",
            "-team",
            "team-",
            "te am",
            "",
            "/team",
            "example.com/",
            "a/b/c",
            "ä",
            "team\n",
            5,
            None,
        ]
    ),
    ANY_TEXT,
)
GOOD_LABEL_VALUE = st.sampled_from(["", "a", "NVIDIA-A100-SXM4-80GB", "x" * 63, "v1.2_3"])
BAD_LABEL_VALUE = st.one_of(st.sampled_from(["x" * 64, "-x", "x-", "a b", "a\n", "日本", 1, None, True]), ANY_TEXT)
LABELS = field(
    st.dictionaries(GOOD_LABEL_KEY, GOOD_LABEL_VALUE, max_size=3),
    st.dictionaries(
        st.one_of(GOOD_LABEL_KEY, BAD_LABEL_KEY), st.one_of(GOOD_LABEL_VALUE, BAD_LABEL_VALUE), min_size=1, max_size=2
    ),
)
SELECTOR = field(
    st.dictionaries(
        st.sampled_from(["zone", "nvidia.com/gpu.product", "cloud.google.com/gke-accelerator", "kubernetes.io/arch"]),
        st.sampled_from(["a", "Tesla-T4", "NVIDIA-L4", "amd64"]),
        max_size=2,
    ),
    st.dictionaries(
        st.one_of(GOOD_LABEL_KEY, BAD_LABEL_KEY), st.one_of(GOOD_LABEL_VALUE, BAD_LABEL_VALUE), min_size=1, max_size=2
    ),
)
GOOD_TOLERATION = st.sampled_from(
    [
        {"key": "gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "team", "value": "ml"},
        {"key": "team", "operator": "Equal", "value": "ml", "effect": "PreferNoSchedule"},
        {"operator": "Exists"},
        {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
        {"key": "example.com/spot", "operator": "Exists"},
    ]
)
BAD_TOLERATION = st.one_of(
    st.sampled_from(
        [
            {"key": "a", "operator": "Exists", "value": "x"},
            {"value": "x"},
            {"operator": "Equal"},
            {"key": 5},
            {"key": "a", "tolerationSeconds": 30, "effect": "NoSchedule"},
            {"key": "a", "tolerationSeconds": 30},
            {"key": "a", "tolerationSeconds": "30", "effect": "NoExecute"},
            {"key": "a b"},
            {"key": "a", "value": 1},
            {"key": "a", "value": "x" * 64},
            {"key": "a", "tolerationSeconds": 2**63, "effect": "NoExecute"},
            {"key": "a", "tolerationSeconds": True, "effect": "NoExecute"},
            {"key": "x." * 130 + "io/a"},
            {"key": "a", "operator": None},
            {"key": "a", "effect": None},
            {"key": None, "operator": "Exists"},
        ]
    ),
    st.fixed_dictionaries(
        {},
        optional={
            "key": st.one_of(GOOD_LABEL_KEY, BAD_LABEL_KEY),
            "operator": st.sampled_from(["Exists", "Equal", "exists", "In", None, 1]),
            "value": st.one_of(GOOD_LABEL_VALUE, BAD_LABEL_VALUE),
            "effect": st.sampled_from(["NoSchedule", "PreferNoSchedule", "NoExecute", "noschedule", "", None]),
            "tolerationSeconds": st.one_of(st.integers(-10, 10**6), st.sampled_from([2**63, "30", 30.5, True, None])),
            "tolerationseconds": st.just(5),
        },
    ),
    WRONG_TYPES,
)
SECURITY_OK = st.sampled_from(
    [
        {},
        {"runAsNonRoot": True},
        {"runAsUser": 1500},
        {"readOnlyRootFilesystem": True},
        {"capabilities": {"add": ["NET_BIND_SERVICE"], "drop": ["ALL"]}},
        {"seccompProfile": {"type": "Localhost", "localhostProfile": "p.json"}},
    ]
)
SECURITY_BAD = st.sampled_from(
    [
        {"privileged": True},
        {"runAsUser": 0},
        {"runAsNonRoot": False},
        {"allowPrivilegeEscalation": True},
        {"capabilities": {"add": ["SYS_ADMIN"]}},
        {"capabilities": {}},
        {"seccompProfile": {"type": "Unconfined"}},
        {"procMount": "Unmasked"},
        {"allowPrivilegeEscalation": None},
    ]
)
KUBERNETES_OPTIONS: dict[str, st.SearchStrategy[Any]] = {
    "namespace": field(
        st.sampled_from(["ml", "default", "a" * 63]), st.sampled_from(["ML", "a" * 64, "-ml", "ml\n", "m.l"])
    ),
    "node_selector": SELECTOR,
    "accelerator_labels": SELECTOR,
    "labels": LABELS,
    "annotations": field(st.dictionaries(GOOD_LABEL_KEY, ANY_TEXT, max_size=3), LABELS),
    "tolerations": field(
        st.lists(GOOD_TOLERATION, max_size=3),
        st.lists(st.one_of(GOOD_TOLERATION, BAD_TOLERATION), min_size=1, max_size=3),
        GOOD_TOLERATION,
    ),
    "gpu_toleration": field(st.booleans()),
    "label_scheme": field(st.sampled_from(["nvidia-gfd", "gke", "eks", "karpenter", "none"]), st.just("GKE")),
    "service_account_name": field(st.sampled_from(["trainer", "a.b"]), st.sampled_from(["A", "a_b", "a" * 254])),
    "image_pull_secrets": field(
        st.sampled_from(["regcred", "a,b", ["regcred"], []]), st.sampled_from(["a,,b", "a, b", ["A"], [1]])
    ),
    "image_pull_policy": field(st.sampled_from(["Always", "IfNotPresent", "Never"]), st.just("always")),
    "priority_class_name": field(st.sampled_from(["high", "system-node-critical"]), st.just("High")),
    "kueue_queue": field(st.sampled_from(["team-a", "", "q.v1", "a" * 63]), st.sampled_from(["Team", "a" * 64, "a_b"])),
    "runtime_class_name": field(st.sampled_from(["nvidia", "kata.containers"]), st.just("Nvidia")),
    "container_security_context": field(SECURITY_OK, SECURITY_BAD),
    "pod_security": field(st.sampled_from(["restricted", "baseline"]), st.just("privileged")),
    "run_as_user": field(st.sampled_from([1, 1000, 2**31 - 1]), st.sampled_from([0, -1, 2**31, 2**32, True])),
    "requirements_mode": field(st.sampled_from(["init-container", "image"])),
    "derived_image": IMAGES,
    "installer_image": IMAGES,
    "index_secret": field(st.sampled_from(["pip-netrc", "netrc.v1"]), st.sampled_from(["Pip", "a_b"])),
    "pending_timeout": SECONDS,
    "startup_timeout": SECONDS,
    "termination_grace_period": field(st.integers(0, 3600), st.sampled_from([-1, 2**63, 2**63 - 1, 10**20, 1.5])),
    "on_finish_action": field(st.sampled_from(["delete_pod", "keep_pod", "delete_succeeded_pod"]), st.just("delete")),
    "affinity": field(
        st.sampled_from(
            [
                {},
                {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [
                                {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
                            ]
                        }
                    }
                },
                {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}},
            ]
        ),
        st.sampled_from(
            [
                [],
                {"nodeAffinity": []},
                {"nodeAffinity": None},
                {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": None}},
                {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [1]}}},
                {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [{"matchExpressions": {}}]
                        }
                    }
                },
            ]
        ),
    ),
    "pod_template_dict": field(
        st.sampled_from(
            [
                {"spec": {"nodeSelector": {"nvidia.com/gpu.product": "Tesla-T4"}}},
                {"spec": {}},
                {},
                {"spec": {"tolerations": [{"key": "a", "operator": "Exists"}]}},
                {"spec": None},
                {"metadata": {"labels": {"team": "ml"}}, "spec": {"containers": [{"name": "base"}]}},
            ]
        ),
        st.sampled_from(
            [
                {"kind": "Job"},
                {"spec": []},
                {"spec": {"containers": [{}]}},
                {"spec": {"containers": {}}},
                {"metadata": "x"},
                {"spec": {"nodeSelector": ["a"]}},
                {"spec": {"nodeSelector": {"a": 1}}},
                {"spec": {"tolerations": {"key": "a"}}},
                {"spec": {"affinity": {"nodeAffinity": []}}},
                {"spec": {"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-L4"}}},
            ]
        ),
    ),
}
UNKNOWN_OPTIONS = st.sampled_from([{"bogus_option": 1}, {"mounts": []}, {"namespace": "ml"}, {1: 2}, {"": 0}])


# ---------------------------------------------------------------------------------------------- the property
def _note(outcome: str) -> None:
    """Count the outcome (``--hypothesis-show-statistics``), when a Hypothesis test runs."""
    if currently_in_test_context():
        event(outcome)


def _field_root(field: str) -> str:
    return field.split("[", 1)[0].split("(", 1)[0]  # op_kwargs['x'] and a call, train(epochs=...): their roots


def assert_names_its_field(err: InvalidSettingError, allowed: set[str] | frozenset[str]) -> None:
    """The message names the field, and the field is one the case set (or that the set fields ask for)."""
    message = str(err)
    assert isinstance(err.field, str), f"no field: {message}"
    assert err.field or isinstance(err, UnknownSettingError), f"no field: {message}"  # the option '' is unknown
    _note(f"refused: {_field_root(err.field)}")
    if isinstance(err, UnknownSettingError):
        assert repr(err.field) in message, message
    else:
        assert err.field in message, f"{err.field!r} not in {message!r}"
        if err.value is not ...:  # ...: a call, shown by its parameters' names (task/call.py)
            assert redact(repr(err.value))[:40] in message, message  # credentials in the value are redacted (S1)
    assert _field_root(err.field) in allowed or err.field in allowed, f"{err.field!r} not among {sorted(allowed)}"


def check_resources(resources: ResourceSettings) -> None:
    """An accepted ResourceSettings is normalised: typed, finite, within its bounds."""
    _note("accepted")
    if resources.cpu_count is not None:
        assert isinstance(resources.cpu_count, float) and math.isfinite(resources.cpu_count)
        assert float(MIN_CPUS) <= resources.cpu_count <= MAX_CPUS
    assert resources.gpu_count == "all" or (type(resources.gpu_count) is int and 0 <= resources.gpu_count <= 1024)
    for name in ("memory", "shm_size"):
        value = getattr(resources, name)
        assert value is None or (type(value) is int and 0 < value <= MAX_BYTES), (name, value)
    assert isinstance(resources.gpu_vendor, GpuVendor)
    assert resources.accelerator is None or re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", resources.accelerator)
    assert resources.mig_profile is None or re.fullmatch(r"[1-9][0-9]*g\.[1-9][0-9]*gb(\+me)?", resources.mig_profile)
    resources.describe()
    resources.without_gpus()


def check_tolerations(spec: dict[str, Any]) -> None:
    """The API server's toleration rules, which no JSON schema states (core/validation validateTolerations)."""
    label_key = re.compile(
        r"([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
        r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
    )
    for toleration in spec.get("tolerations") or []:
        key, operator = toleration.get("key") or "", toleration.get("operator") or "Equal"
        assert not key or (label_key.fullmatch(key) and len(key.rpartition("/")[0]) <= 253), toleration
        assert key or operator == "Exists", f"an empty key needs operator Exists: {toleration}"
        if operator == "Exists":
            assert not toleration.get("value"), f"operator Exists takes no value: {toleration}"
        else:
            assert re.fullmatch(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?", toleration.get("value") or "")
        if toleration.get("tolerationSeconds") is not None:
            assert toleration.get("effect") == "NoExecute", f"tolerationSeconds needs NoExecute: {toleration}"


def check_manifests(objects: list[dict[str, Any]], options: Any) -> None:
    _note("accepted and rendered")
    restricted = options.pod_security == "restricted"
    assert objects
    for obj in objects:
        validate(obj, restricted=restricted)
        if obj["kind"] == "Pod":
            check_tolerations(obj["spec"])
        elif obj["kind"] == "Job":
            check_tolerations(obj["spec"]["template"]["spec"])


def check_docker_plan(plan: Any) -> None:
    """What ``create_container`` sends: docker-py's objects build, mounts and working dir are ones the engine takes."""
    _note("accepted and planned")
    version = docker.constants.DEFAULT_DOCKER_API_VERSION
    for cpu_fallback in (False, True):
        kwargs = plan.create_kwargs("registry.example.com/x:1", cpu_fallback=cpu_fallback)
        host_config = kwargs.pop("host_config")
        mounts = host_config.pop("mounts", [])
        built = [
            docker.types.Mount(m["Target"], m["Source"] or None, type=m["Type"], read_only=m["ReadOnly"])
            for m in mounts
        ]
        targets = [posixpath.normpath(m["Target"]) for m in built] + [DOCKER_CONTAINER_DIR]
        assert all(t.startswith("/") and t != "/" and "\x00" not in t for t in targets), targets
        assert len(set(targets)) == len(targets), f"a mount target twice: {targets}"
        for m in built:
            assert isinstance(m["ReadOnly"], bool), m
            if m["Type"] == "tmpfs":
                assert not m["Source"], f"the engine refuses a tmpfs mount with a source: {m}"
            else:
                assert isinstance(m["Source"], str) and m["Source"] and "\x00" not in m["Source"], m
        config = docker.types.HostConfig(version, mounts=built or None, **host_config)
        assert all(isinstance(v, str) for v in kwargs["environment"].values()), kwargs["environment"]
        working_dir = kwargs.get("working_dir")
        assert working_dir is None or (posixpath.isabs(working_dir) and "\x00" not in working_dir), working_dir
        docker.types.ContainerConfig(
            version,
            kwargs["image"],
            kwargs["command"],
            user=kwargs.get("user"),
            environment=kwargs["environment"],
            working_dir=working_dir,
            labels=kwargs["labels"],
            host_config=config,
        )


# ---------------------------------------------------------------------------------------------- settings
@settings(FUZZ, max_examples=CASES["resources"])
@given(kwargs=some_of(RESOURCE_VALUES))
def test_resource_settings_accept_or_name_the_field(kwargs: dict[str, Any]) -> None:
    try:
        resources = ResourceSettings(**kwargs)
    except InvalidSettingError as err:
        assert_names_its_field(err, set(kwargs))
        return
    check_resources(resources)


@settings(FUZZ, max_examples=CASES["image"])
@given(kwargs=some_of(IMAGE_VALUES))
@example(kwargs={"index_url": "https://[::1/simple"})  # urlparse's ValueError escaped
def test_image_settings_accept_or_name_the_field(kwargs: dict[str, Any]) -> None:
    try:
        image = ImageSettings(**kwargs)
    except InvalidSettingError as err:
        assert_names_its_field(err, set(kwargs))
        return
    assert all(isinstance(r, str) and r == r.strip() and r for r in image.requirements)
    assert all(isinstance(k, str) and isinstance(v, str) and "\x00" not in v for k, v in image.environment.items())
    for arg in image.installer_index_args():
        assert isinstance(arg, str) and arg.strip(), image
    assert not any(a.startswith("-") for a in image.installer_index_args()[1::2]), image.installer_index_args()
    assert image.requirements_hash
    _note("accepted")


# ---------------------------------------------------------------------------------------------- the operator
def train(epochs, lr=0.1, *, batch=8, **extra):  # a DAG author's function, as written in a DAG file
    import math

    return math.floor(epochs * lr) + batch + len(extra)


def positional(a, b, /, c=1):
    return a + b + c


def varargs(*values, params=None):
    return [values, params]


def nothing():
    return None


CALLABLES = st.sampled_from([train, positional, varargs, nothing])
JSON_VALUE = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=False), ANY_TEXT),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(ANY_TEXT, inner, max_size=3),
    max_leaves=6,
)
NOT_JSON = st.one_of(
    WRONG_TYPES.filter(lambda v: not isinstance(v, (bool, list, dict, tuple))),
    st.sampled_from([NAN, INF, [NAN], {"x": {1, 2}}, {(1, 2): 3}]),
)
ARGUMENT = field(st.one_of(JSON_VALUE, st.tuples(st.integers(), ANY_TEXT)), NOT_JSON)
PARAMETERS = st.sampled_from(["epochs", "lr", "batch", "a", "b", "c", "params", "other", "values"])
OP_ARGS = field(st.one_of(st.lists(ARGUMENT, max_size=3), st.lists(ARGUMENT, max_size=2).map(tuple)), st.just("ab"))
OP_KWARGS = field(
    st.dictionaries(PARAMETERS, ARGUMENT, max_size=3),
    st.dictionaries(st.sampled_from([1, None, ("a",)]), ARGUMENT, min_size=1, max_size=1),
)
COMMAND = field(
    st.one_of(
        st.lists(
            st.one_of(ANY_TEXT, st.sampled_from(["python", "-c", "print(1)", "--epochs", 3])), min_size=1, max_size=4
        ),
        st.sampled_from(["python train.py --epochs 3", "echo $HOME", "python -c 'print(1)'"]),
    ),
    st.sampled_from(
        ["python 'unterminated", "", "   ", "a\x00b", ["a\x00b"], [], ["python", None], ["x", b"y"], ["x", True]]
    ),
)
# A DAG param (JSON, as Airflow's params are) that a template renders into a resource field, as text.
TEMPLATE_PARAM = st.one_of(
    st.integers(0, 8),
    st.sampled_from(["2", "16Gi", "A100:2", "all", "1g.10gb"]),
    NUMBER_TEXT,
    INTS,
    ANY_TEXT,
    st.lists(st.integers(), max_size=2),
    st.none(),
)
TEMPLATED = st.sampled_from(
    ["cpu_count", "gpu_count", "memory", "shm_size", "accelerator", "gpu_vendor", "mig_profile"]
)
RESOURCES = st.one_of(
    st.builds(ResourceSettings, gpu_count=st.integers(0, 2), cpu_count=st.sampled_from([1, 0.5])),
    st.sampled_from(
        [
            ResourceSettings(accelerator="A100:2", memory="16Gi", shm_size="2Gi"),
            ResourceSettings(mig_profile="1g.10gb"),
            ResourceSettings(gpu_vendor="amd", gpu_count=1),
            ResourceSettings(accelerator="TPU-V5E"),
            ResourceSettings(gpu_count="all"),
            {"gpu_count": 1},
        ]
    ),
)
POLICIES = field(st.sampled_from(["fail", "wait", "cpu", "{{ params.policy }}"]), st.sampled_from(["FAIL", "skip"]))


@st.composite
def operator_kwargs(draw: st.DrawFn, backend_options: Mapping[str, st.SearchStrategy[Any]] | None) -> dict[str, Any]:
    """GpuStepOperator arguments: a function and its arguments (or a command), resources, image, options."""
    kwargs: dict[str, Any] = {}
    if draw(st.integers(0, 9)) < 8:
        kwargs["python_callable"] = draw(CALLABLES)
        kwargs |= draw(a_few({"op_args": OP_ARGS, "op_kwargs": OP_KWARGS}, 2))
    if "python_callable" not in kwargs or draw(st.integers(0, 29)) == 0:
        kwargs["command"] = draw(COMMAND) if draw(st.integers(0, 29)) else None
    if draw(st.integers(0, 4)):
        kwargs |= draw(a_few(RESOURCE_VALUES, 3))
    else:
        kwargs["resources"] = draw(RESOURCES)
    if draw(st.integers(0, 4)) == 0:
        kwargs[draw(TEMPLATED)] = "{{ params.value }}"
    if draw(st.integers(0, 2)):
        kwargs |= draw(
            a_few({k: IMAGE_VALUES[k] for k in ("parent_image", "requirements", "python_package_installer")}, 2)
        )
    else:
        image = draw(a_few(IMAGE_VALUES, 3))
        try:
            kwargs["image"] = ImageSettings(**image)
        except InvalidSettingError:
            kwargs["image"] = draw(st.sampled_from([None, "ubuntu", ImageSettings(requirements=["numpy"])]))
    kwargs |= draw(a_few({"environment": ENVIRONMENT, "on_missing_gpu": POLICIES}, 2))
    if backend_options is not None and draw(st.integers(0, 9)) < 9:
        options = draw(a_few(backend_options, 3))
        if draw(st.integers(0, 14)) == 0:
            options |= draw(UNKNOWN_OPTIONS)
        if draw(st.integers(0, 19)) == 0:
            options = draw(st.sampled_from([None, {}, [], "namespace=ml", Opaque()]))
        kwargs["backend_options"] = options
    return kwargs


def _allowed_fields(kwargs: Mapping[str, Any]) -> set[str]:
    allowed = set(kwargs) | {"python_callable/command", "task_id"}
    if {"op_args", "op_kwargs"} & set(kwargs):
        allowed.add("op_args/op_kwargs")
    if kwargs.get("python_callable") is not None:  # its call: an argument missing, unknown or too many
        allowed.add(getattr(kwargs["python_callable"], "__name__", "?"))
    if RESOURCE_FIELDS & set(kwargs) or kwargs.get("resources") is not None:
        allowed |= RESOURCE_FIELDS  # one resource field may contradict another (accelerator count vs gpu_count)
    if IMAGE_FIELDS & set(kwargs) or kwargs.get("image") is not None:
        allowed |= IMAGE_FIELDS
    options = kwargs.get("backend_options")
    if isinstance(options, Mapping):
        allowed |= {str(key) for key in options}
    if options or kwargs.get("image") is not None or "requirements" in kwargs or RESOURCE_FIELDS & set(kwargs):
        allowed.add("backend_options")  # the backend asks for an option these settings need (index_secret, ...)
    return allowed


def _construct(kwargs: dict[str, Any]) -> GpuStepOperator | None:
    """The operator, or None when construction refused it with an error naming a field the case set."""
    try:
        return GpuStepOperator(task_id="fuzz", **kwargs)
    except InvalidSettingError as err:
        assert_names_its_field(err, _allowed_fields(kwargs))
        return None


def _templated(kwargs: Mapping[str, Any]) -> bool:
    return any(isinstance(v, str) and "{{" in v for v in kwargs.values())


def _resolved_request(task: GpuStepOperator, context: Any, backend: str | None = None) -> tuple[Any, Any, Any]:
    """The backend, its options and the request, as when the task starts (``TaskSpec.rendered``)."""
    spec = task.rendered_spec(backend=backend)
    return spec.info, spec.options, task.task_request(context, spec, GpuConfig.read())


def _resolve(operator: GpuStepOperator, kwargs: dict[str, Any], value: Any, backend: str | None = None) -> Any:
    """The task's backend, options and request as when it starts (templates rendered with ``params.value``)."""
    task, context = stand_in(operator, {"value": value, "policy": "cpu"})
    try:
        return task, context, _resolved_request(task, context, backend)
    except InvalidSettingError as err:
        if not _templated(kwargs):
            raise
        assert_names_its_field(err, _allowed_fields(kwargs) | RESOURCE_FIELDS)
        return None


def _accepted(kwargs: dict[str, Any], value: Any, backend: str) -> Any:
    """The operator for ``backend``, resolved as when its task starts; ``None`` when refused (naming the field)."""
    kwargs = {**kwargs, "backend": backend}
    operator = _construct(kwargs)
    return None if operator is None else _resolve(operator, kwargs, value)


@settings(FUZZ, max_examples=CASES["kubernetes"])
@given(kwargs=operator_kwargs(KUBERNETES_OPTIONS), value=TEMPLATE_PARAM)
# Regressions: each of these escaped as another exception type, or was accepted and then refused or rendered invalid.
@example(kwargs={"python_callable": train, "op_kwargs": {"epochs": b"16"}}, value=None)  # TypeError at render
@example(kwargs={"python_callable": train, "op_args": 1}, value=None)  # TypeError: 'int' object is not iterable
@example(kwargs={"python_callable": train, "op_kwargs": "２"}, value=None)  # ValueError from dict()
@example(kwargs={"command": "python 'unterminated"}, value=None)  # shlex's ValueError
@example(kwargs={"command": 0}, value=None)  # TypeError
@example(kwargs={"command": ["true"], "backend_options": "namespace=ml"}, value=None)  # options named by letter
@example(kwargs={"command": ["true"], "backend_options": {1: 2, "a": 3}}, value=None)  # TypeError in sorted()
@example(kwargs={"command": ["true"], "backend_options": {"pod_template_dict": {"spec": {}}}}, value=None)
@example(
    kwargs={"command": ["true"], "backend_options": {"container_security_context": {"privileged": True}}}, value=None
)
@example(kwargs={"command": ["true"], "backend_options": {"startup_timeout": NAN}}, value=None)  # int(nan)
@example(kwargs={"command": ["true"], "backend_options": {"pending_timeout": 2**2000}}, value=None)
@example(kwargs={"command": ["true"], "backend_options": {"termination_grace_period": 2**63}}, value=None)
@example(kwargs={"command": ["true"], "backend_options": {"labels": {"x." * 130 + "io/a": "b"}}}, value=None)
@example(
    kwargs={
        "command": ["true"],
        "backend_options": {"tolerations": [{"key": "a", "operator": "Exists", "value": "x"}]},
    },
    value=None,
)
@example(
    kwargs={"command": ["true"], "backend_options": {"tolerations": [{"key": "a", "tolerationSeconds": 30}]}},
    value=None,
)
@example(
    kwargs={
        "command": ["true"],
        "accelerator": "T4",
        "backend_options": {"node_selector": {"nvidia.com/gpu.product": "a"}},
    },
    value=None,
)  # refused only when planned
@example(
    kwargs={"command": ["true"], "accelerator": "A100", "backend_options": {"affinity": {"nodeAffinity": []}}},
    value=None,
)  # AttributeError when planned
def test_kubernetes_operator_accepts_and_renders_valid_pods_or_names_the_field(kwargs: dict[str, Any], value: Any):
    resolved = _accepted(kwargs, value, "kubernetes")
    if resolved is None:
        return
    _, context, (info, options, request) = resolved
    try:
        objects = info.backend_class()(options).render(request, GpuConfig.read(), context)
    except InvalidSettingError as err:
        raise AssertionError(f"accepted at parse time, refused when rendered: {err}") from err
    check_manifests(objects, options)


@settings(FUZZ, max_examples=CASES["docker"])
@given(kwargs=operator_kwargs(DOCKER_OPTIONS), value=TEMPLATE_PARAM)
# Regressions: accepted at parse time, then refused when planned or rejected by the engine; or another exception type.
@example(kwargs={"command": ["true"], "mig_profile": "1g.10gb"}, value=None)
@example(kwargs={"command": ["true"], "gpu_vendor": "aws-neuron", "gpu_count": 1}, value=None)
@example(kwargs={"command": ["true"], "backend_options": {"working_dir": "work"}}, value=None)
@example(
    kwargs={
        "command": ["true"],
        "backend_options": {"mounts": [{"target": "/s", "type": "tmpfs"}, {"target": "/s/", "type": "tmpfs"}]},
    },
    value=None,
)
@example(
    kwargs={"command": ["true"], "backend_options": {"mounts": [{"source": "/d\x00", "target": "/d"}]}}, value=None
)  # os.path.realpath's ValueError
@example(
    kwargs={
        "command": ["true"],
        "backend_options": {"mounts": [{"source": "/data", "target": "/d", "read_only": "no"}]},
    },
    value=None,
)
@example(
    kwargs={"command": ["true"], "backend_options": {"mounts": [{"source": "x", "target": "/t", "type": "tmpfs"}]}},
    value=None,
)
@example(
    kwargs={"command": ["true"], "backend_options": {"mounts": [{"source": "/data", "target": "/airflow-gpu"}]}},
    value=None,
)
@example(kwargs={"command": ["true"], "backend_options": {"stop_timeout": INF}}, value=None)
def test_docker_operator_accepts_and_plans_a_valid_container_or_names_the_field(kwargs: dict[str, Any], value: Any):
    resolved = _accepted(kwargs, value, "docker")
    if resolved is None:
        return
    _, _, (info, options, request) = resolved
    try:
        plan = info.backend_class()(options).plan(request, GpuConfig.read())
    except InvalidSettingError as err:
        raise AssertionError(f"accepted at parse time, refused when planned: {err}") from err
    check_docker_plan(plan)


BACKEND_NAMES = field(
    st.sampled_from(["local", "docker", "kubernetes", None, "{{ params.backend }}"]),
    st.sampled_from(["Kubernetes", "k8s", "lsf", "", " local", "local\n"]),
    WRONG_TYPES,
)
LOCAL_OPTIONS: dict[str, st.SearchStrategy[Any]] = {
    "devices": field(st.sampled_from(["0,1", "1", "0"]), st.sampled_from(["x", "", "-1", "0,0", "٣", "none", "0=L4"])),
    "kill_grace": SECONDS,
}
OPTIONS_OF = {"local": LOCAL_OPTIONS, "docker": DOCKER_OPTIONS, "kubernetes": KUBERNETES_OPTIONS}


@settings(FUZZ, max_examples=CASES["any_backend"])
@given(backend=BACKEND_NAMES, data=st.data(), value=TEMPLATE_PARAM)
def test_any_backend_name_is_accepted_and_resolves_or_names_the_field(backend: Any, data: Any, value: Any) -> None:
    """Any backend name, ``None`` (``[gpu] backend``) and a template; options for the named backend, or any."""
    own = OPTIONS_OF.get(backend) if isinstance(backend, str) else None
    kwargs = data.draw(operator_kwargs(own or data.draw(st.sampled_from(list(OPTIONS_OF.values())))))
    if backend is not None:
        kwargs = {**kwargs, "backend": backend}
    _construct_and_resolve(kwargs, value)


def _construct_and_resolve(kwargs: dict[str, Any], value: Any) -> None:
    operator = _construct(kwargs)
    if operator is None:
        return
    task, context = stand_in(operator, {"value": value, "policy": "cpu", "backend": "docker"})
    try:
        _resolved_request(task, context)
    except InvalidSettingError as err:
        if not _templated(kwargs):
            raise AssertionError(f"accepted at parse time, refused when the task starts: {err}") from err
        assert_names_its_field(err, _allowed_fields(kwargs) | RESOURCE_FIELDS | {"backend_options"})
    _note("accepted")


@settings(FUZZ, max_examples=CASES["arguments"])
@given(function=CALLABLES, op_args=OP_ARGS, op_kwargs=OP_KWARGS)
def test_callable_arguments_are_checked_against_the_signature_at_parse(function: Any, op_args: Any, op_kwargs: Any):
    kwargs = {"python_callable": function, "op_args": op_args, "op_kwargs": op_kwargs, "backend": "local"}
    operator = _construct(kwargs)
    if operator is None:
        return
    task, context = stand_in(operator)
    _, _, request = _resolved_request(task, context)
    assert request.envelope.mode == "callable"
    _note("accepted")


@pytest.mark.parametrize(
    "options",
    [{"bogus_option": 1}, {"kill_grace": 0}, {"state_dir": "/tmp/x"}, Opaque(), "namespace=ml"],
    ids=["unknown", "zero-grace", "a-state-dir-of-its-own", "not-a-dict", "a-string"],
)
def test_without_a_backend_the_options_are_checked_for_the_default_backend(options: Any) -> None:
    """Regression: with no ``backend``, ``backend_options`` went unchecked until the task started ([gpu] backend)."""
    _construct_and_resolve({"command": ["true"], "backend_options": options}, None)
    with pytest.raises(InvalidSettingError, match="backend_options|bogus_option|no state dir of its own"):
        GpuStepOperator(task_id="fuzz", command=["true"], backend_options=options)


def test_the_deep_corpus_has_at_least_5000_cases_and_make_test_a_tenth() -> None:
    assert sum(DEEP.values()) >= 5000 and sum(CASES.values()) >= sum(DEEP.values()) // 10


# ---------------------------------------------------------------------------- the engine's authorization plugin
# What a DAG file's own code may send the engine (finding H1): any create body, spelled as Go reads it. Under one
# admin policy, the plugin (policy/authz) answers for every body; whatever it allows must meet the policy as the
# engine will read the body (names folded as Go folds them, a name given twice merged, HostConfig's fields taken at
# the top level), by the independent rules below; and for a body the provider could send (a plain JSON object),
# the plugin and the provider's final check (policy/engine.check_create) give the same verdict.
def _other_digits(number: int) -> str:
    """A number in Arabic-Indic digits: a digit to Python's ``int``, a name to the engine (Go's ``strconv.Atoi``)."""
    return "".join(chr(0x660 + int(digit)) for digit in str(number))


VIDEO_GID = next((g.gr_gid for g in grp.getgrall() if g.gr_name == "video"), 44)  # the host's device group
WORKER_IDS = (os.geteuid(), os.getegid())
ENGINE_USERS = {  # the user of a create body: numbers, names the image would resolve, digits Go does not read
    "": "", "0": "0", "0:0": "0:0", "root": "root", "1000:1000": "1000:1000",
    "worker": "{}:{}".format(*WORKER_IDS), "worker's uid": str(WORKER_IDS[0]),
    "worker's name": f"{pwd.getpwuid(WORKER_IDS[0]).pw_name}:{WORKER_IDS[1]}",
    "worker in other digits": "{}:{}".format(*map(_other_digits, WORKER_IDS)),
}  # fmt: skip
ENGINE_HOST_FIELDS = {
    "Privileged": [True, False], "CapAdd": [["SYS_ADMIN"], ["SYS_PTRACE"], ["sys_ptrace"], ["CAP_SYS_PTRACE"], ["ALL"]],
    "CapDrop": [[], ["all"], ["ALL"], ["ALL", "CHOWN"]], "OomKillDisable": [True],
    "SecurityOpt": [["seccomp=unconfined"], [], ["no-new-privileges"], ["no-new-privileges:false"]],
    "PidMode": ["host", "", "container:x"], "IpcMode": ["host", "private", "container:x", "none"],
    "NetworkMode": ["host", "default", "bridge", "ml-net", "container:x", "none"], "UTSMode": ["host"],
    "UsernsMode": ["host"], "CgroupnsMode": ["host", "private"], "Cgroup": ["container:x"], "Binds": [["/:/h"]],
    "VolumesFrom": [["x"]], "Links": [["x:y"]], "Sysctls": [{"kernel.core_pattern": "|/x"}, {}],
    "Devices": [[{"PathOnHost": "/dev/sda", "PathInContainer": "/d"}], [{"PathOnHost": "/dev/kfd"}]],
    "DeviceRequests": [[{"Capabilities": [["gpu"]], "Count": 1}], [{"Capabilities": [["gpu", "utility"]]}],
                       [{"Driver": "x", "Capabilities": [["gpu"]]}], [{"Capabilities": [["gpu"]], "Options": {"a": "b"}}]],
    "DeviceCgroupRules": [["a *:* rwm"]],
    "GroupAdd": [["0"], ["video"], ["ml"], ["docker"], [str(VIDEO_GID)], [_other_digits(VIDEO_GID)], ["4242"]],
    "MaskedPaths": [[], None], "ReadonlyPaths": [[]], "CgroupParent": ["/", ""], "Runtime": ["runsc", ""],
    "OomScoreAdj": [-1000, 0], "LogConfig": [{"Type": "syslog", "Config": {}}, {"Type": "", "Config": {}}],
    "PortBindings": [{"80/tcp": [{"HostPort": "80"}]}], "Memory": [2**30], "ShmSize": [2**20], "Isolation": ["hyperv"],
}  # fmt: skip


def _go_spellings(name: str) -> st.SearchStrategy[str]:
    """A field's name as Go's reader still matches it: any case, ``ſ`` for ``s`` and ``K`` (Kelvin) for ``k``."""
    folded = name.replace("s", "ſ").replace("k", "\u212a")
    return st.sampled_from([name, name, name.lower(), name.upper(), folded])


@st.composite
def engine_bodies(draw: st.DrawFn, base: str) -> tuple[list, bool]:
    """A create body as (name, value) pairs (a name may come twice), and whether it is a plain JSON object."""
    sources = [f"{base}/ro", f"{base}/rw", f"{base}/ro/sub", f"{base}/rw/sub", f"{base}/ckpt/d/r/t", f"{base}/ckpt",
               f"{base}/state/docker-tasks/task-1", f"{base}/link", "/", "/etc", "/var/run/docker.sock", "models"]  # fmt: skip
    mount = st.fixed_dictionaries(
        {"Type": st.sampled_from(["bind", "bind", "volume", "tmpfs", "npipe", "Bind"]),
         "Source": st.sampled_from(sources), "Target": st.just("/m"), "ReadOnly": st.booleans()},
        optional={"VolumeOptions": st.just({"DriverConfig": {"Name": "local", "Options": {"device": "/"}}}),
                  "BindOptions": st.just({"Propagation": "rshared"})},
    )  # fmt: skip
    host: list = [("CapDrop", ["ALL"]), ("SecurityOpt", ["no-new-privileges:true"])]
    labels = [("airflow-gpu-provider.deployment", os.environ["AIRFLOW__GPU_POLICY__DEPLOYMENT"])]
    top: list = [("Image", "img"), ("Cmd", ["true"]), ("Labels", labels)]
    plain = True
    for _ in range(draw(st.integers(0, 3))):
        name = draw(st.sampled_from(sorted(ENGINE_HOST_FIELDS)))
        value = draw(st.sampled_from(ENGINE_HOST_FIELDS[name]))
        spelled = draw(_go_spellings(name))
        where = draw(st.sampled_from(["host", "host", "top"]))
        plain = plain and spelled == name and where == "host" and name not in {n for n, _ in host}
        (host if where == "host" else top).append((spelled, value))
    if draw(st.booleans()):
        host.append(("Mounts", draw(st.lists(mount, min_size=1, max_size=2))))
    top.append(("User", draw(st.sampled_from(sorted(ENGINE_USERS.values())))))
    if draw(st.integers(0, 4)) == 0:
        network = draw(st.sampled_from(["default", "host", "ml-net", "bridge"]))
        links = draw(st.sampled_from([None, ["x"]]))
        top.append(("NetworkingConfig", [("EndpointsConfig", [(network, [("Links", links)])])]))
    if draw(st.integers(0, 5)) > 0:  # most bodies have a HostConfig; without it, the engine reads the top level
        top.append((draw(_go_spellings("HostConfig")) if draw(st.booleans()) else "HostConfig", host))
        plain = plain and top[-1][0] == "HostConfig"
    else:
        top.extend(host)
        plain = False
    return top, plain


def _json(pairs: Any) -> str:
    """JSON text of (name, value) pairs, a name possibly twice (``json.dumps`` cannot write that)."""
    if isinstance(pairs, list) and all(isinstance(p, tuple) and len(p) == 2 for p in pairs) and pairs:
        return "{" + ", ".join(f"{json.dumps(name)}: {_json(value)}" for name, value in pairs) + "}"
    if isinstance(pairs, list):
        return "[" + ", ".join(_json(item) for item in pairs) + "]"
    return json.dumps(pairs)


def _go_read(text: str) -> dict[str, Any]:
    """The body as Go's ``encoding/json`` fills the engine's structs: names folded, a name twice merged."""

    def merge(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        merged: dict[str, Any] = {}
        for name, value in pairs:
            key = name.casefold()
            if isinstance(merged.get(key), dict) and isinstance(value, dict):
                merged[key] = {**merged[key], **value}
            else:
                merged[key] = value
        return merged

    return json.loads(text, object_pairs_hook=merge)


def _engine_meets(body: dict[str, Any], policy: Any) -> None:
    """The container the engine would make gives nothing beyond ``policy`` (rules D1-D5, written again)."""
    from airflow_gpu_provider.policy.docker import DEVICE_PATHS

    top_host = {k: v for k, v in body.items() if k.casefold() in {n.casefold() for n in ENGINE_HOST_FIELDS}}
    host = {**top_host, **(body.get("hostconfig") or {})}  # the union: stricter than the engine's either-or
    assert not host.get("privileged") and not host.get("oomkilldisable") and host.get("capdrop") == ["ALL"], host
    assert set(host.get("securityopt") or []) <= {"no-new-privileges:true", "no-new-privileges"}
    assert set(host.get("securityopt") or [])
    for capability in host.get("capadd") or []:
        assert capability.upper().removeprefix("CAP_") in policy.capabilities - {"ALL"}, capability
    for key in (
        "pidmode",
        "utsmode",
        "usernsmode",
        "cgroupnsmode",
        "cgroup",
        "binds",
        "volumesfrom",
        "links",
        "sysctls",
        "devicecgrouprules",
        "cgroupparent",
        "runtime",
        "oomscoreadj",
        "portbindings",
        "isolation",
    ):
        assert not host.get(key), (key, host[key])  # fmt: skip
    assert host.get("maskedpaths") is None and host.get("readonlypaths") is None
    assert not (host.get("logconfig") or {}).get("type")
    assert host.get("networkmode") in (None, "", "default", *policy.network_modes)
    assert host.get("ipcmode") in (None, "", "default", *policy.ipc_modes)
    assert all(device.get("pathonhost") in DEVICE_PATHS for device in host.get("devices") or [])
    assert all(r.get("capabilities") == [["gpu"]] and not r.get("options") for r in host.get("devicerequests") or [])
    gids = {g.gr_gid for g in grp.getgrall() if g.gr_name in {*policy.groups, "video", "render"}}
    gids |= {int(group) for group in policy.groups if re.fullmatch("[0-9]+", group)}
    for group in host.get("groupadd") or []:  # the host's gids in ASCII digits: no name the image resolves
        assert re.fullmatch("[0-9]+", str(group)) and int(group) in gids, group
    endpoints = (body.get("networkingconfig") or {}).get("endpointsconfig") or {}
    assert all(name == "default" or name in policy.network_modes for name in endpoints), endpoints
    assert not any((settings or {}).get("links") for settings in endpoints.values())
    mounts = host.get("mounts") or []
    if any(m.get("type") != "tmpfs" for m in mounts) or host.get("devices") or host.get("devicerequests"):
        user = str(body.get("user") or "")  # numbers only, the worker's own ([gpu_policy] allowed_users is empty here)
        assert not policy.users and re.fullmatch("[0-9]+:[0-9]+", user), user
        assert tuple(map(int, user.split(":"))) == WORKER_IDS, user
    for mount in mounts:
        assert not mount.get("volumeoptions", {}).get("driverconfig") and not mount.get("bindoptions")
        kind, source = mount.get("type") or "bind", mount.get("source")
        assert kind in ("bind", "volume", "tmpfs"), kind
        if kind == "volume":
            assert source in policy.volumes
        elif kind == "bind":
            assert os.path.realpath(source) == source, f"{source} is reached through a link"
            made = source.startswith(f"{policy.state_dir}/docker-tasks/") and mount.get("readonly")
            made = made or any(source.startswith(f"{r}/") for r in policy.checkpoint_roots)
            roots = [r for r in policy.mount_roots if source == r.path or source.startswith(f"{r.path}/")]
            assert made or any(r.path == source and (r.writable or mount.get("readonly")) for r in roots) or any(
                not r.writable and mount.get("readonly") for r in roots), (source, roots)  # fmt: skip


@pytest.fixture(scope="module")
def engine_policy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Host folders and one admin's ``[gpu]`` section for the plugin's cases."""
    base = tmp_path_factory.mktemp("authz")
    for folder in ("ro/sub", "rw/sub", "ckpt/d/r/t", "state/docker-tasks/task-1"):
        (base / folder).mkdir(parents=True)
    (base / "state").chmod(0o700)
    (base / "link").symlink_to("/etc")
    section = {
        "ALLOWED_MOUNT_ROOTS": f"{base}/ro:ro,{base}/rw:rw", "ALLOWED_VOLUMES": "models",
        "ALLOWED_CAPABILITIES": "SYS_PTRACE", "ALLOWED_GROUPS": "ml", "ALLOWED_NETWORK_MODES": "bridge,none,ml-net",
        "ALLOWED_CHECKPOINT_ROOTS": f"{base}/ckpt", "STATE_DIR": f"{base}/state", "ALLOWED_USERS": "",
    }  # fmt: skip
    variables = {f"AIRFLOW__GPU{'' if name == 'STATE_DIR' else '_POLICY'}__{name}": v for name, v in section.items()}
    saved = {name: os.environ.get(name) for name in variables}
    os.environ.update(variables)
    yield str(base)
    for name, value in saved.items():
        os.environ.pop(name) if value is None else os.environ.__setitem__(name, value)


def test_what_the_engines_plugin_allows_meets_the_admins_policy(engine_policy: str) -> None:
    import base64

    from airflow_gpu_provider.policy import Policy
    from airflow_gpu_provider.policy.authz.calls import Refused, match
    from airflow_gpu_provider.policy.authz.judge import decide
    from airflow_gpu_provider.policy.engine import check_create
    from airflow_gpu_provider.policy.paths import UnsafePathError

    policy = Policy.current()
    seen = Counter()

    @settings(FUZZ, max_examples=CASES["authz"])
    @given(drawn=engine_bodies(engine_policy))
    def case(drawn: tuple[list, bool]) -> None:
        pairs, plain = drawn
        text = _json(pairs)
        request = {"RequestMethod": "POST", "RequestUri": "/v1.41/containers/create",
                   "RequestHeaders": {"Content-Type": "application/json"},
                   "RequestBody": base64.b64encode(text.encode()).decode()}  # fmt: skip
        allowed, why = decide(request, policy, lambda kind, name: None)
        seen["allowed" if allowed else "refused"] += 1
        if allowed:
            _engine_meets(_go_read(text), policy)
        try:
            match(request, text.encode())  # in the provider's form: judged by the provider's own check
        except Refused:
            plain = False
        if plain:  # a body the provider could send: the provider's own check gives the same verdict
            try:
                check_create(json.loads(text), policy)
                provider = ""
            except UnsafePathError as err:
                provider = str(err)
            assert why.removeprefix("POST /v1.41/containers/create: ") == provider, (text, why, provider)
            seen["plain"] += 1

    case()
    print(f"\nthe engine's authorization plugin, {CASES['authz']} create bodies: {dict(seen)}")
    assert seen["allowed"] > CASES["authz"] // 20 and seen["refused"] > CASES["authz"] // 20, seen
    assert seen["plain"] > CASES["authz"] // 20, seen  # in the provider's own form: judged by its own check

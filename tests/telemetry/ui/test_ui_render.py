"""The GPU tab and the GPUs page as HTML and SVG, from the sample profiles in ``profiles.py`` (no Airflow needed)."""

from __future__ import annotations

import copy
import re

import pytest
from telemetry.ui.profiles import CPU_PROFILE, ESCALATION, FALLBACK_PROFILE, GIB, GPU_PROFILE, hostile

from airflow_gpu_provider.telemetry.profile import MAX_POINTS, Profile
from airflow_gpu_provider.telemetry.ui.chart import memory_chart, utilisation_chart
from airflow_gpu_provider.telemetry.ui.format import ProfileRow, TaskKey, TaskTry, requested
from airflow_gpu_provider.telemetry.ui.html import e
from airflow_gpu_provider.telemetry.ui.overview_page import Filters, render_overview
from airflow_gpu_provider.telemetry.ui.task_page import (
    CPU_BADGE,
    FALLBACK_BADGE,
    render_no_profile,
    render_task_page,
)
from airflow_gpu_provider.telemetry.ui.timeline import render_timeline

KEY = TaskKey("gpu_training_demo", "manual__2026-11-23T13:00:00+00:00", "train")
MAX_PAGE_BYTES = 120_000


def page(value: dict, key: TaskKey = KEY) -> str:
    profile = Profile.read(value)
    assert profile is not None
    return render_task_page(profile, key, home="/gpu/")


def paths(svg: str) -> list[str]:
    return re.findall(r'<path class="series" data-device="([^"]*)"', svg)


def test_gpu_profile_page_has_a_line_per_device_and_the_numbers():
    html = page(GPU_PROFILE)
    svgs = re.findall(r"<svg .*?</svg>", html)
    assert len(svgs) == 2  # utilisation, memory
    for svg in svgs:
        assert paths(svg) == ["0", "1"]
    for text in (
        "GPU profile",
        "GPU utilisation (%)",
        "GPU memory used",
        "NVIDIA A100-SXM4-80GB",
        "71 %",  # mean util of GPU 0
        "98 %",  # p95
        "6.1 GiB of 80.0 GiB",  # peak memory, absolute
        "8 %",  # ... and in % of the card
        "4.20 Wh",
        "12 s",  # idle
        "310 W",
        "61 °C",
        "1 min 33 s",  # duration
        "2× A100, 16.0 GiB memory, 4 CPUs",  # requested
        "2× NVIDIA A100-SXM4-80GB",  # assigned
        "peak 6.1 GiB of 80 GiB (8 %): an A10G or MIG 1g.10gb would do",
        "0.129 (A100-80GB at 2.50 per GPU-hour)",
        "try 1",
        "host worker-1",
        'href="/gpu/"',
    ):
        assert text in html, text
    assert CPU_BADGE not in html
    assert len(html.encode()) < MAX_PAGE_BYTES


def test_cpu_profile_is_labelled_as_such():
    html = page(CPU_PROFILE)
    assert CPU_BADGE in html
    assert "CPU utilisation of the task&#x27;s process tree (%)" in html
    assert "Memory (RSS) of the task&#x27;s process tree" in html
    assert "no GPU (CPU profile)" in html
    assert "CPU (task process tree, 2 cores)" in html
    assert "try 2" in html and "backend docker" in html
    assert "no price set for this model ([gpu] prices)" in html
    svgs = re.findall(r"<svg .*?</svg>", html)
    assert [paths(svg) for svg in svgs] == [["cpu"], ["cpu"]]


def test_a_value_above_100_percent_widens_the_axis():
    value = copy.deepcopy(CPU_PROFILE)
    value["series"]["cpu"]["util"][20] = 180.0
    profile = Profile.read(value)
    assert profile is not None
    assert ">180 %</text>" in utilisation_chart(profile)
    assert ">100 %</text>" in utilisation_chart(Profile.read(CPU_PROFILE))  # type: ignore[arg-type]


def test_memory_axis_is_the_card_for_a_gpu_and_the_peak_for_a_cpu_profile():
    assert ">80 GiB</text>" in memory_chart(Profile.read(GPU_PROFILE))  # type: ignore[arg-type]
    cpu = memory_chart(Profile.read(CPU_PROFILE))  # type: ignore[arg-type]
    assert ">396 MiB</text>" in cpu  # peak 360 MiB, the axis 10 % above
    assert "GiB" not in cpu


@pytest.mark.parametrize("sample", [GPU_PROFILE, CPU_PROFILE], ids=["gpu", "cpu"])
def test_everything_rendered_is_escaped(sample):
    html = page(hostile(sample), TaskKey('dag"<b>', "run<script>", "task&<i>", 3))
    assert "<script" not in html
    assert "<img" not in html
    assert "<b>" not in html and "<i>" not in html
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in html
    assert "onerror=alert(1)&gt;" in html  # the text is there, as text
    assert re.search(r'data-device="0&lt;script', html)  # the device index in an attribute, escaped too
    overview = render_overview(
        [ProfileRow(TaskKey('dag"<b>', "run<script>", "task", 0), 0.0, Profile.read(hostile(sample)))],  # type: ignore[arg-type]
        base="/gpu",
        limit=200,
    )
    assert "<script" not in overview and "<img" not in overview and "<b>" not in overview
    assert 'href="/gpu/dags/dag%22%3Cb%3E/runs/run%3Cscript%3E/tasks/task?map_index=0"' in overview


def test_a_long_series_is_cut_to_max_points():
    value = copy.deepcopy(GPU_PROFILE)
    n = 20 * MAX_POINTS
    value["series"] = {"t": list(range(n)), "0": {"util": [50.0] * n, "memory_used": [GIB] * n}, "1": {}}
    profile = Profile.read(value)
    assert profile is not None
    svg = memory_chart(profile)
    (d,) = re.findall(r' d="([^"]*)"', svg)
    assert d.count("L") == MAX_POINTS - 1
    assert len(page(value).encode()) < MAX_PAGE_BYTES


def test_gaps_in_a_series_start_a_new_segment():
    value = copy.deepcopy(GPU_PROFILE)
    value["series"]["0"]["util"][10] = None
    profile = Profile.read(value)
    assert profile is not None
    (d, _) = re.findall(r' d="([^"]*)"', utilisation_chart(profile))
    assert d.count("M") == 2


@pytest.mark.parametrize(
    "value",
    [None, "a string", [1, 2], {"version": 3, "kind": "gpu"}, {}],
    ids=["none", "string", "list", "unknown-version", "empty"],
)
def test_what_is_no_profile_reads_as_none(value):
    assert Profile.read(value) is None


@pytest.mark.parametrize(
    "value",
    [
        {"version": 1},
        {"version": 1, "devices": [{"index": 0, "mean_util": "high"}], "series": {"t": "x", "0": [1]}},
        {"version": 1, "devices": "x", "series": None, "advice": "text", "cost": {"amount": "free"}, "started": 1e300},
        {"version": 1, "devices": {"0": {}}, "advice": {"a": 1}, "task": [], "requested": "x", "samples": -1},
        {"version": 1, "devices": [{}], "series": {"t": [0, 1], "": {"util": [float("nan"), True]}}},
    ],
    ids=["bare", "wrong-types", "wrong-containers", "dicts-for-lists", "nan-and-bools"],
)
def test_a_malformed_profile_still_renders(value):
    html = page(value)
    assert "<h1>GPU profile" in html
    render_overview([ProfileRow(KEY, 0.0, Profile.read(value))], base="/gpu", limit=200)  # type: ignore[arg-type]


def test_overview_lists_tasks_newest_first_and_the_hosts_and_models():
    rows = [
        ProfileRow(TaskKey("gpu_training_demo", "r2", "train"), 2.0, Profile.read(CPU_PROFILE)),  # type: ignore[arg-type]
        ProfileRow(TaskKey("sweep", "r1", "trial", 3), 1.0, Profile.read(GPU_PROFILE)),  # type: ignore[arg-type]
    ]
    html = render_overview(rows, base="/gpu", limit=200)
    assert html.index("gpu_training_demo / train") < html.index("sweep / trial [3]")
    assert 'href="/gpu/dags/sweep/runs/r1/tasks/trial?map_index=3"' in html
    for text in (
        "2× A100, 16.0 GiB memory, 4 CPUs",  # requested
        "2× NVIDIA A100-SXM4-80GB",  # assigned, and the model on the host
        "6.1 GiB (8 %)",  # peak used
        "37 %",  # mean utilisation over both GPUs
        'title="0.129 (A100-80GB at 2.50 per GPU-hour)">0.129<',
        "an A10G or MIG 1g.10gb would do",
        "worker-1",
        "ci-runner-7",
        "no GPU (CPU profile)",
        "0.05 GPU-hours",
        "cost 0.13",
    ):
        assert text in html, text
    hosts = html[html.index("Hosts and models") :]
    assert re.search(
        r"<td>worker-1</td><td>2× NVIDIA A100-SXM4-80GB</td><td class=num>2</td><td class=num>1</td>", hosts
    )


def test_overview_scans_hosts_first_then_each_tasks_advice_once_then_the_tries():
    """Ten runs of one task with the same advice: the advice is shown once, each row links to it."""
    rows = [
        ProfileRow(TaskKey("sweep", f"r{n}", "trial"), float(n), Profile.read(GPU_PROFILE))  # type: ignore[arg-type]
        for n in range(10, 0, -1)
    ] + [ProfileRow(TaskKey("gpu_training_demo", "r0", "train"), 0.0, Profile.read(CPU_PROFILE))]  # type: ignore[arg-type]
    html = render_overview(rows, base="/gpu", limit=200)
    headings = re.findall(r"<h2>([^<]*)</h2>", html)
    assert headings == ["Hosts and models", "Advice", "Recent GPU tasks"]
    for note in GPU_PROFILE["advice"]:
        assert html.count(e(note)) == 1, note
    advice = html[html.index("<h2>Advice</h2>") : html.index("<h2>Recent GPU tasks</h2>")]
    assert re.search(r'<a id="advice-1" href="/gpu/dags/sweep/runs/r10/tasks/trial\?map_index=-1">sweep / trial</a>'
                     r"</td><td class=num>10</td>", advice)  # fmt: skip
    assert '<a id="advice-2" href="/gpu/dags/gpu_training_demo/runs/r0/tasks/train?map_index=-1">' in advice
    tries = html[html.index("<h2>Recent GPU tasks</h2>") :]
    assert tries.count(f'<a href="#advice-1">{len(GPU_PROFILE["advice"])} notes</a>') == 10
    assert '<a href="#advice-2">1 note</a>' in tries


def test_overview_filters_by_host_and_model_among_the_tries_read():
    rows = [
        ProfileRow(TaskKey("sweep", "r1", "trial"), 1.0, Profile.read(GPU_PROFILE)),  # type: ignore[arg-type]
        ProfileRow(TaskKey("gpu_training_demo", "r0", "train"), 0.0, Profile.read(CPU_PROFILE)),  # type: ignore[arg-type]
    ]
    on_cpu = render_overview(rows, base="/gpu", limit=200, filters=Filters(model="CPU"))
    assert "gpu_training_demo / train" in on_cpu and "sweep / trial" not in on_cpu
    assert "1 of the 2 newest (at most 200) with model CPU" in on_cpu
    assert '<option value="CPU" selected>CPU</option><option value="NVIDIA A100-SXM4-80GB">' in on_cpu
    on_worker = render_overview(rows, base="/gpu", limit=200, filters=Filters(host="worker-1"))
    assert "sweep / trial" in on_worker and "gpu_training_demo / train" not in on_worker
    nothing = render_overview(rows, base="/gpu", limit=200, filters=Filters(host="elsewhere"))
    assert "No try matches these filters." in nothing and '<option value="elsewhere" selected>' in nothing


def test_overview_without_profiles_says_so():
    assert "No GPU task has reported a profile yet" in render_overview([], base="/gpu", limit=200)


@pytest.mark.parametrize(
    ("state", "expected"),
    [
        (None, "No such task instance."),
        ("running", "The task is running: its profile appears here when the try ends."),
        ("success", "This task try (success) has no GPU profile: it is not a GPU task"),
        ("<b>", "This task try (&lt;b&gt;)"),
    ],
)
def test_no_profile_page_says_why(state, expected):
    html = render_no_profile(KEY, state=state, home="/gpu/")
    assert "No GPU profile" in html
    assert expected in html


@pytest.mark.parametrize(
    ("request_", "expected"),
    [
        ({"gpu_count": 1, "accelerator": "A100", "mig_profile": "1g.10gb"}, "1× A100 (MIG 1g.10gb)"),
        ({"gpu_count": "all", "memory": "16Gi", "cpu_count": 0.5}, "all GPUs, 16Gi, 0.5 CPUs"),
        ({"gpu_count": 2, "memory": 4 * GIB}, "2× GPU, 4.0 GiB memory"),
        ({}, "–"),
    ],
)
def test_requested_resources_read_either_form(request_, expected):
    assert requested(request_) == expected


def test_an_incomplete_profile_says_so():
    value = {**CPU_PROFILE, "error": "NVML went away <b>"}
    assert "Profile incomplete: NVML went away &lt;b&gt;" in page(value)


def test_a_version_2_profile_shows_the_worker_the_container_the_host_cpus_and_the_fallback():
    html = page(FALLBACK_PROFILE)
    assert FALLBACK_BADGE in html and CPU_BADGE not in html
    for text in (
        "worker-2.example.com (sampled in 3f2a9c1b7d4e)",  # the worker; the container the sampler ran in
        "the Docker engine cannot start GPU containers (could not select device driver)",
        "no GPU (CPU fallback)",
        "CPU pressure 46 %, 10-s peak 81 % (/proc/pressure/cpu, host view)",
        "the CPUs often waited: the host was busy (CPU pressure 46 %)",
        "The task fell back to the CPU",
    ):
        assert text in html, text
    overview = render_overview([ProfileRow(KEY, 0.0, Profile.read(FALLBACK_PROFILE))], base="/gpu", limit=9)  # type: ignore[arg-type]
    assert '<span class="badge">CPU fallback</span>' in overview and "no GPU (CPU fallback)" in overview


def test_a_version_1_profile_still_reads_without_the_new_fields():
    profile = Profile.read(GPU_PROFILE)
    assert profile is not None and profile.node == "" and profile.host_cpu is None and not profile.cpu_fallback
    assert "not read (a profile of version 1, or no /proc)" in page(GPU_PROFILE)


def test_the_tries_list_links_every_profiled_try_and_marks_the_one_shown():
    first = Profile.read({**FALLBACK_PROFILE, "task": {"try_number": 1}})
    second = Profile.read({**GPU_PROFILE, "task": {"try_number": 2}})
    assert first is not None and second is not None
    tries = [
        TaskTry(1, "failed", 1_795_442_000.0, 1_795_442_060.0, "worker-2", first),
        TaskTry(2, "success", 1_795_442_100.0, None, "worker-1", second),
        TaskTry(3, None, None, None, "", None),
    ]
    html = render_task_page(first, KEY, home="/gpu/", tries=tries)
    assert "try 1 of 3" in html
    assert "<strong>try 1</strong> (shown)" in html
    link = "/gpu/dags/gpu_training_demo/runs/manual__2026-11-23T13%3A00%3A00%2B00%3A00/tasks/train?map_index=-1"
    assert f'<a href="{link}&amp;try_number=2">try 2</a>' in html
    rows = re.findall(r"<tr><td>(.*?)</td></tr>", html[html.index("<h2>Tries</h2>") :].split("</table>")[0])
    assert [row.split("</td><td>")[1] for row in rows] == ["–", "success", "failed"]  # newest first
    assert "2026-11-23 13:53:20 UTC" in html and "worker-2" in html and "CPU fallback" in rows[2]
    assert "no profile" in rows[0]


def test_the_escalation_timeline_reads_in_words():
    html = render_timeline(ESCALATION["on_oom"], ESCALATION["tries"])
    cells = [re.findall(r"<td>(.*?)</td>", row) for row in re.findall(r"<tr><td>.*?</tr>", html)]
    assert cells == [
        [
            "1",
            '<span class="nowrap">2026-11-23 13:55:20+00:00</span>',
            "ran out of GPU memory on NVIDIA L4 (24.0 GiB)",
            "1× L4, 16.0 GiB memory, 4 CPUs",
            "accelerator L4 → A100-80GB; memory 16.0 GiB → 32.0 GiB",
        ],
        [
            "2",
            '<span class="nowrap">2026-11-23 14:00:00+00:00</span>',
            "succeeded",
            "1× A100-80GB, 32.0 GiB memory, 4 CPUs",
            "–",
        ],
    ]
    assert "On out of memory: accelerators=L4 -&gt; A100-80GB." in html
    assert "85899345920" not in html and "1795442120.25" not in html  # no bytes, no epoch floats


def test_the_timeline_is_in_the_deployments_time_zone_and_survives_bad_entries():
    import datetime

    cet = datetime.timezone(datetime.timedelta(hours=1))
    assert "2026-11-23 14:55:20+01:00" in render_timeline("", ESCALATION["tries"], zone=cet)
    evil = '<script>alert("x")</script>'
    bad = [
        {"try": "1", "kind": evil, "at": "yesterday", "resources": [], "error": evil},
        {"try": 2, "kind": "host_oom", "at": float("nan"), "resources": {"memory": evil, "gpu_count": 0}},
        {"try": True, "kind": "gpu_oom", "gpu_memory": "lots", "gpu_model": evil},
    ]
    html = render_timeline(evil, bad)
    assert "<script" not in html and "&lt;script&gt;" in html
    assert "ran out of host memory" in html and "no GPU" in html and "ran out of GPU memory on &lt;script" in html
    assert render_timeline("", []) == ""


def test_a_lone_sample_is_drawn_over_its_interval():
    """A short task's one sample is a visible step from the start to its time, not a bare move."""
    value = copy.deepcopy(GPU_PROFILE)
    value["series"] = {"t": [2.0], "0": {"util": [40.0], "memory_used": [GIB]}}
    profile = Profile.read(value)
    assert profile is not None
    (d,) = re.findall(r' d="([^"]*)"', utilisation_chart(profile))
    start, end = (point.split(",") for point in d[1:].split("L"))
    assert start[1] == end[1] and float(start[0]) < float(end[0])  # a level stroke of some length


def test_each_try_shows_how_it_ended_and_one_cpu_is_one_cpu():
    """Issue 36: failed tries looked like successes on the GPUs page; one CPU read "1 CPUs"."""
    one_cpu = {**GPU_PROFILE, "requested": {**GPU_PROFILE["requested"], "cpu_count": 1}}
    rows = [
        ProfileRow(TaskKey("sweep", "r2", "trial"), 2.0, Profile.read(GPU_PROFILE), "failed"),  # type: ignore[arg-type]
        ProfileRow(TaskKey("sweep", "r1", "trial"), 1.0, Profile.read(one_cpu), "success"),  # type: ignore[arg-type]
    ]
    tries = render_overview(rows, base="/gpu", limit=200)
    tries = tries[tries.index("<h2>Recent GPU tasks</h2>") :]
    assert "<th>State</th>" in tries and tries.index('<span class="badge">failed</span>') < tries.index("success")
    assert "16.0 GiB memory, 1 CPU<" in tries and "4 CPUs" in tries
    assert [ProfileRow.try_state(*case) for case in (("up_for_retry", 1, 1), ("running", 2, 1), ("success", 2, 2))] == [
        "failed", "failed", "success",
    ]  # fmt: skip

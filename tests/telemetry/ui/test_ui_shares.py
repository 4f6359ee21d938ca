"""Shares of one GPU on the GPU tab and the GPUs page: how much of which GPU, enforced how, and who held them."""

from __future__ import annotations

import copy

from telemetry.ui.profiles import GPU_PROFILE

from airflow_gpu_provider.telemetry.profile import Profile
from airflow_gpu_provider.telemetry.report import summary_lines
from airflow_gpu_provider.telemetry.ui.format import ProfileRow, TaskKey, requested
from airflow_gpu_provider.telemetry.ui.overview_page import render_overview
from airflow_gpu_provider.telemetry.ui.task_page import render_task_page

LINE = "a share of 8.0 GiB (34 %) of GPU GPU-5a1c, enforced by MPS (the admin's daemon): ..."


def _shared(task: str, memory: int, started: float) -> ProfileRow:
    value = copy.deepcopy(GPU_PROFILE)
    value["devices"] = value["devices"][:1]
    value["started"] = started
    value["requested"] = {"gpu_count": 1, "gpu_share": memory}
    value["share"] = {"memory": memory, "percent": 34, "gpu": "GPU-5a1c", "enforcement": "mps", "line": LINE}
    profile = Profile.read(value)
    assert profile is not None
    return ProfileRow(TaskKey("embed", "r1", task), started, profile)


def test_the_gpu_tab_and_the_log_say_how_the_share_was_enforced():
    row = _shared("batch_a", 8 * 2**30, 1_795_442_000.0)
    html = render_task_page(row.profile, row.key, home="/gpu/")
    assert "<th>GPU share</th><td>8.0 GiB (34 %) of GPU GPU-5a1c, enforced by mps</td>" in html
    assert "a share of 1× NVIDIA A100-SXM4-80GB" in html
    assert f"  {LINE}" in summary_lines(row.profile)
    assert requested({"gpu_count": 1, "gpu_share": 8 * 2**30}) == "8.0 GiB of 1× GPU"
    assert requested({"gpu_count": 0.25}) == "0.25× GPU"


def test_the_gpus_page_lists_who_shared_each_gpu():
    rows = [_shared("batch_b", 4 * 2**30, 1_795_442_100.0), _shared("batch_a", 8 * 2**30, 1_795_442_000.0)]
    html = render_overview(
        [*rows, ProfileRow(TaskKey("train", "r1", "fit"), 0.0, Profile.read(GPU_PROFILE))], base="/gpu", limit=10
    )  # type: ignore[arg-type]
    section = html[html.index("<h2>Shared GPUs</h2>") : html.index("<h2>Recent GPU tasks</h2>")]
    assert section.index("embed / batch_a") < section.index("embed / batch_b")  # by GPU, then in order
    assert "8.0 GiB (34 %) of GPU GPU-5a1c, enforced by mps" in section and "4.0 GiB" in section
    assert "train / fit" not in section  # a whole-GPU try is no share

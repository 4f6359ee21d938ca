"""The GPU tab of a task instance: its tries; one try's charts, per-device summary, advice and cost; the timeline.

The timeline is the ``on_oom`` escalation history of the tries (``timeline.py``).
"""

from __future__ import annotations

from collections.abc import Sequence

from airflow_gpu_provider.telemetry.profile import Device, Profile
from airflow_gpu_provider.telemetry.ui.chart import colour, memory_chart, utilisation_chart
from airflow_gpu_provider.telemetry.ui.format import (
    TaskKey,
    TaskTry,
    duration,
    fixed,
    gib,
    money,
    pct,
    requested,
    shared,
)
from airflow_gpu_provider.telemetry.ui.html import e, fact_table, layout, table, task_path, when

CPU_BADGE = "CPU profile (no GPU on this host)"
FALLBACK_BADGE = "CPU fallback"
RUNNING = ("running", "queued", "scheduled", "up_for_retry", "up_for_reschedule", "deferred", "restarting")


def _device_row(device: Device, position: int) -> list[str]:
    total = f" of {gib(device.memory_total)}" if device.memory_total else ""
    return [
        f'<span class="swatch" style="background:{colour(position)}"></span>{e(device.index)}',
        e(device.name or "–"),
        e(pct(device.mean_util)),
        e(pct(device.p95_util)),
        e(f"{gib(device.peak_memory)}{total}"),
        e(pct(device.peak_memory_pct)),
        e(fixed(device.energy_wh, "Wh", 2)),
        e(duration(device.idle_s)),
        e(fixed(device.peak_power_w, "W", 0)),
        e(fixed(device.max_temperature_c, "°C", 0)),
    ]


def _legend(profile: Profile) -> str:
    items = "".join(
        f'<span><span class="swatch" style="background:{colour(i)}"></span>{e(d.index)}: {e(d.name)}</span>'
        for i, d in enumerate(profile.devices)
    )
    return f'<div class="legend">{items}</div>'


def _assigned(profile: Profile) -> str:
    if profile.cpu_fallback:
        return "no GPU (CPU fallback)"
    if profile.is_cpu:
        return "no GPU (CPU profile)"
    share = "a share of " if profile.share is not None else ""
    return f"{share}{len(profile.devices)}× " + ", ".join(sorted({d.name or "GPU" for d in profile.devices}))


def _try_row(entry: TaskTry, key: TaskKey, home: str, shown: int | None) -> list[str]:
    profile = entry.profile
    label = f"try {entry.number}"
    if entry.number == shown:
        link = f"<strong>{e(label)}</strong> (shown)"
    elif profile is not None:
        link = f'<a href="{e(task_path(home.rstrip("/"), key))}&amp;try_number={entry.number}">{e(label)}</a>'
    else:
        link = e(label)
    notes = [FALLBACK_BADGE] if profile is not None and profile.cpu_fallback else []
    if profile is None:
        notes.append("no profile" if entry.state not in RUNNING else "running: no profile yet")
    return [
        link,
        e(entry.state or "–"),
        f'<span class="nowrap">{e(when(entry.started or (profile.started if profile else None)))}</span>',
        e(entry.hostname or (profile.host if profile else "") or "–"),
        e(gib(profile.peak_memory) if profile else "–"),
        e(pct(profile.mean_util) if profile else "–"),
        e(", ".join(notes)),
    ]


def tries_section(tries: Sequence[TaskTry], key: TaskKey, home: str, shown: int | None) -> str:
    """The task instance's tries, each linking to its profile (the one shown is marked)."""
    if not tries:
        return ""
    rows = [_try_row(entry, key, home, shown) for entry in reversed(tries)]
    headers = ["Try", "State", "Started", "Worker host", "Peak memory", "Mean util", ""]
    return "<h2>Tries</h2>" + table(headers, rows, numeric=frozenset({4, 5}))


def timeline_section(timeline: str) -> str:
    """The ``on_oom`` escalation timeline (``timeline.render_timeline``), when the task has one."""
    return f"<h2>Out-of-memory escalation</h2>{timeline}" if timeline else ""


def _host(profile: Profile) -> str:
    if profile.node and profile.node != profile.host:
        return f"{profile.host or '–'} (sampled in {profile.node})"
    return profile.host or "–"


def _host_cpu(profile: Profile) -> str:
    figures = profile.host_cpu
    if figures is None:
        return "not read (a profile of version 1, or no /proc)"
    peak = "" if figures.peak_avg10 is None else f", 10-s peak {figures.peak_avg10:.0f} %"
    return f"{figures.describe()}{peak} ({figures.source}, {figures.scope} view)"


def render_task_page(
    profile: Profile,
    key: TaskKey,
    *,
    home: str,
    tries: Sequence[TaskTry] = (),
    timeline: str = "",
) -> str:
    """The whole page for one task try's profile; ``home`` is the GPUs page's path.

    :param tries: every try of the task instance (``store.task_tries``), listed with links to their profiles
    :param timeline: the escalation timeline's HTML (``timeline.render_timeline``)
    """
    heading = "CPU profile" if profile.is_cpu else "GPU profile"
    badge = f'<span class="badge">{e(CPU_BADGE)}</span>' if profile.is_cpu and not profile.cpu_fallback else ""
    if profile.cpu_fallback:
        badge = f'<span class="badge">{e(FALLBACK_BADGE)}</span>'
    try_number = profile.try_number
    latest = max((entry.number for entry in tries), default=try_number)
    backend = profile.task.get("backend")
    meta = [
        key.label,
        f"run {key.run_id}",
        f"try {try_number}" + (f" of {latest}" if latest and latest > 1 else "") if try_number else "",
        f"host {profile.host}" if profile.host else "",
        f"backend {backend}" if isinstance(backend, str) else "",
    ]
    facts = [
        ("Started", when(profile.started)),
        ("Duration", duration(profile.duration_s)),
        ("Samples", f"{profile.samples} every {fixed(profile.interval_s, 's', 1)}"),
        ("Requested", requested(profile.requested)),
        ("Assigned", _assigned(profile)),
        *([("GPU share", shared(profile.share))] if profile.share is not None else []),
        *([("CPU fallback", profile.cpu_fallback_reason or "yes")] if profile.cpu_fallback else []),
        ("Host", _host(profile)),
        ("Host CPUs", _host_cpu(profile)),
        ("GPU-seconds", fixed(profile.gpu_seconds, "s", 1)),
        ("Cost", money(profile.cost) if profile.cost else "no price set for this model ([gpu] prices)"),
    ]
    advice = "".join(f"<li>{e(item)}</li>" for item in profile.advice) or "<li>No advice: nothing stood out.</li>"
    if profile.right_size:  # right_size=True: what this try asked for, and why
        advice = f"<li>Right-sized: {e(profile.right_size)}</li>{advice}"
    body = [
        f"<h1>{e(heading)}{badge}</h1>",
        f'<p class="meta">{e(" · ".join(part for part in meta if part))} · <a href="{e(home)}">all GPU tasks</a></p>',
        tries_section(tries, key, home, try_number),
        fact_table(facts),
        "<h2>Over time</h2>",
        _legend(profile),
        utilisation_chart(profile),
        memory_chart(profile),
        "<h2>Per device</h2>",
        table(
            [
                "#",
                "Device",
                "Mean util",
                "p95 util",
                "Peak memory",
                "Peak %",
                "Energy",
                "Idle (<10 %)",
                "Peak power",
                "Max temp",
            ],
            [_device_row(device, i) for i, device in enumerate(profile.devices)],
            numeric=frozenset(range(2, 10)),
        ),
        "<h2>Advice</h2>",
        f'<ul class="advice">{advice}</ul>',
    ]
    if profile.error:
        body.append(f'<p class="note">Profile incomplete: {e(profile.error)}</p>')
    if profile.is_cpu:
        where = "The task fell back to the CPU" if profile.cpu_fallback else "This host has no GPU (or no NVML)"
        body.append(
            f'<p class="note">{where}: utilisation is the CPU share of the task\'s process '
            "tree (100 % = all its CPUs) and memory is its resident set size.</p>"
        )
    body.append(timeline_section(timeline))
    return layout(f"{heading}: {key.label}", "".join(body))


def render_no_profile(
    key: TaskKey, *, state: str | None, home: str, tries: Sequence[TaskTry] = (), timeline: str = ""
) -> str:
    """The page for a task instance without a profile, saying why that may be."""
    label = key.label
    if state is None:
        reason = "No such task instance."
    elif state in RUNNING:
        reason = f"The task is {e(state)}: its profile appears here when the try ends."
    else:
        reason = (
            f"This task try ({e(state)}) has no GPU profile: it is not a GPU task of this provider, profiling is off "
            "(<code>[gpu] profile_interval = 0</code>), or it ended before the first sample."
        )
    body = (
        "<h1>No GPU profile</h1>"
        f'<p class="meta">{e(label)} · run {e(key.run_id)} · <a href="{e(home)}">all GPU tasks</a></p>'
        f'<p class="empty">{reason}</p>'
    )
    body += tries_section(tries, key, home, None) + timeline_section(timeline)
    return layout(f"No GPU profile: {label}", body)

"""The GPU tab of a task instance: one try's charts, per-device summary, advice and cost."""

from __future__ import annotations

from airflow_gpu_provider.telemetry.profile import Device, Profile
from airflow_gpu_provider.telemetry.ui.chart import colour, memory_chart, utilisation_chart
from airflow_gpu_provider.telemetry.ui.format import TaskKey, duration, fixed, gib, money, pct, requested
from airflow_gpu_provider.telemetry.ui.html import e, fact_table, layout, table, when

CPU_BADGE = "CPU profile (no GPU on this host)"


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
    if profile.is_cpu:
        return "no GPU (CPU profile)"
    return f"{len(profile.devices)}× " + ", ".join(sorted({d.name or "GPU" for d in profile.devices}))


def render_task_page(profile: Profile, key: TaskKey, *, home: str) -> str:
    """The whole page for one task try's profile; ``home`` is the GPUs page's path."""
    heading = "CPU profile" if profile.is_cpu else "GPU profile"
    badge = f'<span class="badge">{e(CPU_BADGE)}</span>' if profile.is_cpu else ""
    try_number = profile.task.get("try_number")
    backend = profile.task.get("backend")
    meta = [
        key.label,
        f"run {key.run_id}",
        f"try {try_number}" if isinstance(try_number, int) else "",
        f"host {profile.host}" if profile.host else "",
        f"backend {backend}" if isinstance(backend, str) else "",
    ]
    facts = [
        ("Started", when(profile.started)),
        ("Duration", duration(profile.duration_s)),
        ("Samples", f"{profile.samples} every {fixed(profile.interval_s, 's', 1)}"),
        ("Requested", requested(profile.requested)),
        ("Assigned", _assigned(profile)),
        ("GPU-seconds", fixed(profile.gpu_seconds, "s", 1)),
        ("Cost", money(profile.cost) if profile.cost else "no price set for this model ([gpu] prices)"),
    ]
    advice = "".join(f"<li>{e(item)}</li>" for item in profile.advice) or "<li>No advice: nothing stood out.</li>"
    body = [
        f"<h1>{e(heading)}{badge}</h1>",
        f'<p class="meta">{e(" · ".join(part for part in meta if part))} · <a href="{e(home)}">all GPU tasks</a></p>',
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
        body.append(
            '<p class="note">This host has no GPU (or no NVML): utilisation is the CPU share of the task\'s process '
            "tree (100 % = all its CPUs) and memory is its resident set size.</p>"
        )
    return layout(f"{heading}: {key.label}", "".join(body))


def render_no_profile(key: TaskKey, *, state: str | None, home: str) -> str:
    """The page for a task instance without a profile, saying why that may be."""
    label = key.label
    if state is None:
        reason = "No such task instance."
    elif state in ("running", "queued", "scheduled", "up_for_retry", "up_for_reschedule", "deferred", "restarting"):
        reason = f"The task is {e(state)}: its profile appears here when the try ends."
    else:
        reason = (
            f"This task try ({e(state)}) has no GPU profile: it is not a GPU task of this provider, profiling is off "
            "(<code>[gpu] profile = False</code>), or it ended before the first sample."
        )
    body = (
        "<h1>No GPU profile</h1>"
        f'<p class="meta">{e(label)} · run {e(key.run_id)} · <a href="{e(home)}">all GPU tasks</a></p>'
        f'<p class="empty">{reason}</p>'
    )
    return layout(f"No GPU profile: {label}", body)

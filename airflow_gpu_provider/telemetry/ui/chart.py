"""Server-rendered SVG line charts: one ``<path>`` per device, no JavaScript, no external resources.

At most :data:`~airflow_gpu_provider.telemetry.profile.MAX_POINTS` points per line, coordinates with one decimal: a
two-device chart stays a few tens of kilobytes whatever the task's duration.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from html import escape

from airflow_gpu_provider.telemetry.profile import Profile
from airflow_gpu_provider.telemetry.ui.format import GIB, MIB, duration

WIDTH, HEIGHT = 720, 200
LEFT, RIGHT, TOP, BOTTOM = 56, 12, 12, 28
COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf")


def colour(position: int) -> str:
    """The line colour of the device at ``position`` (the legend uses the same)."""
    return COLOURS[position % len(COLOURS)]


def _path(times: Sequence[float | None], values: Sequence[float | None], x_max: float, y_max: float) -> str:
    """The ``d`` of a path through the points; a missing sample starts a new segment.

    A segment of one sample is drawn as a step over that sample's interval (from the sample before it, or the
    start): a short task's only sample stays visible.
    """
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    segments: list[tuple[float, list[tuple[float, float]]]] = []  # (x where the first sample began, points)
    current: list[tuple[float, float]] | None = None
    previous_x = float(LEFT)
    for t, v in zip(times, values, strict=False):
        x = None if t is None else LEFT + plot_w * min(max(t / x_max, 0.0), 1.0)
        if x is None or v is None:
            current = None
            previous_x = previous_x if x is None else x
            continue
        y = TOP + plot_h * (1.0 - min(max(v / y_max, 0.0), 1.0))
        if current is None:
            current = []
            segments.append((previous_x, current))
        current.append((x, y))
        previous_x = x
    commands: list[str] = []
    for began, points in segments:
        if len(points) == 1:
            x, y = points[0]
            commands.append(f"M{min(began, x - 3):.1f},{y:.1f}L{x:.1f},{y:.1f}")
        else:
            commands.extend(f"{'L' if i else 'M'}{x:.1f},{y:.1f}" for i, (x, y) in enumerate(points))
    return "".join(commands)


def line_chart(
    title: str,
    times: Sequence[float | None],
    lines: Sequence[tuple[str, Sequence[float | None]]],
    *,
    y_max: float,
    y_label: Callable[[float], str],
) -> str:
    """An ``<svg>``: one path per ``(device index, values)`` line, y from 0 to ``y_max``, x over ``times``."""
    known = [t for t in times if t is not None]
    x_max = max(max(known, default=0.0), 1e-9)
    y_max = max(y_max, 1e-9)
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    parts = [
        f'<figure class="chart"><figcaption>{escape(title)}</figcaption>',
        f'<svg role="img" aria-label="{escape(title)}" viewBox="0 0 {WIDTH} {HEIGHT}" '
        f'width="{WIDTH}" height="{HEIGHT}" xmlns="http://www.w3.org/2000/svg">',
        f"<title>{escape(title)}</title>",
    ]
    for fraction in (0.0, 0.25, 0.5, 0.75, 1.0):
        y = TOP + plot_h * (1.0 - fraction)
        parts.append(f'<line class="grid" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" y2="{y:.1f}"/>')
        parts.append(f'<text class="axis" x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">')
        parts.append(f"{escape(y_label(y_max * fraction))}</text>")
    for fraction in (0.0, 0.5, 1.0):
        x = LEFT + plot_w * fraction
        anchor = {0.0: "start", 0.5: "middle", 1.0: "end"}[fraction]
        label = escape(duration(x_max * fraction) if known else "")
        parts.append(f'<text class="axis" x="{x:.1f}" y="{HEIGHT - 8}" text-anchor="{anchor}">{label}</text>')
    for position, (index, values) in enumerate(lines):
        d = _path(times, values, x_max, y_max)
        if d:
            parts.append(
                f'<path class="series" data-device="{escape(index)}" d="{d}" fill="none" '
                f'stroke="{colour(position)}" stroke-width="1.6"/>'
            )
    parts.append("</svg></figure>")
    return "".join(parts)


def utilisation_chart(profile: Profile) -> str:
    """Utilisation (GPU %, or CPU % of the process tree) over time, 0 to 100 %."""
    title = "CPU utilisation of the task's process tree (%)" if profile.is_cpu else "GPU utilisation (%)"
    lines = [(d.index, profile.series[d.index].util) for d in profile.devices]
    top = max([100.0] + [v for _, values in lines for v in values if v is not None])  # CPU % may pass 100
    return line_chart(title, profile.times, lines, y_max=top, y_label=lambda v: f"{v:.0f} %")


def memory_chart(profile: Profile) -> str:
    """Memory used over time: GPU memory up to the largest card; a CPU profile's RSS up to its peak."""
    title = "Memory (RSS) of the task's process tree" if profile.is_cpu else "GPU memory used"
    lines = [(d.index, profile.series[d.index].memory_used) for d in profile.devices]
    peak = max((v for _, values in lines for v in values if v is not None), default=0.0)
    totals = [d.memory_total for d in profile.devices if d.memory_total and not profile.is_cpu]
    top = max([*totals, peak * 1.1, MIB])
    return line_chart(title, profile.times, lines, y_max=top, y_label=lambda v: bytes_label(v, top))


def bytes_label(value: float, top: float) -> str:
    """An axis label in GiB, or in MiB when the axis ends below 2 GiB."""
    if top < 2 * GIB:
        return f"{value / MIB:.0f} MiB"
    return f"{value / GIB:.{0 if top >= 10 * GIB else 1}f} GiB"

"""The GPUs page: recent GPU task tries across DAGs, and the hosts and models seen in their profiles."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from airflow_gpu_provider.telemetry.profile import number
from airflow_gpu_provider.telemetry.ui.format import ProfileRow, fixed, gib, money, pct, requested
from airflow_gpu_provider.telemetry.ui.html import e, layout, table, task_path, when


@dataclass
class _Host:
    models: Counter[str] = field(default_factory=Counter)  # model -> distinct devices
    devices: set[str] = field(default_factory=set)
    tasks: int = 0
    gpu_seconds: float = 0.0
    last_seen: float = 0.0


def _assigned(row: ProfileRow) -> str:
    if row.profile.cpu_fallback:
        return "no GPU (CPU fallback)"
    if row.profile.is_cpu:
        return "no GPU (CPU profile)"
    names = Counter(d.name or "GPU" for d in row.profile.devices)
    return ", ".join(f"{count}× {name}" for name, count in sorted(names.items())) or "–"


def _peak(row: ProfileRow) -> str:
    peak = row.profile.peak_memory
    share = row.profile.peak_memory_pct
    return "–" if peak is None else f"{gib(peak)}" + (f" ({pct(share)})" if share is not None else "")


def _task_row(row: ProfileRow, base: str) -> list[str]:
    profile = row.profile
    link = task_path(base, row.key)
    kind = f' <span class="badge">{"CPU fallback" if profile.cpu_fallback else "CPU"}</span>' if profile.is_cpu else ""
    advice = "".join(f"<li>{e(item)}</li>" for item in profile.advice[:3])
    return [
        f'<span class="nowrap">{e(when(profile.finished or row.stored))}</span>',
        f'<a href="{e(link)}">{e(row.key.label)}</a>{kind}',
        e(row.key.run_id),
        e(profile.host or "–"),
        e(requested(profile.requested)),
        e(_assigned(row)),
        e(_peak(row)),
        e(pct(profile.mean_util)),
        f'<span title="{e(money(profile.cost))}">{e(fixed(number((profile.cost or {}).get("amount")), "", 3))}</span>',
        f'<ul class="advice">{advice}</ul>' if advice else "",
    ]


def _hosts(rows: Sequence[ProfileRow]) -> dict[str, _Host]:
    hosts: dict[str, _Host] = defaultdict(_Host)
    for row in rows:
        host = hosts[row.profile.host or "(unknown host)"]
        host.tasks += 1
        host.gpu_seconds += 0.0 if row.profile.is_cpu else row.profile.gpu_seconds or 0.0
        host.last_seen = max(host.last_seen, row.profile.finished or row.stored)
        for device in row.profile.devices:
            key = device.uuid or f"{device.index}:{device.name}"
            if key not in host.devices:
                host.devices.add(key)
                host.models[device.name or "GPU"] += 1
    return dict(sorted(hosts.items()))


def render_overview(rows: Sequence[ProfileRow], *, base: str, limit: int) -> str:
    """The whole GPUs page for ``rows`` (newest first); ``base`` is where the app is mounted."""
    total_cost = sum(number((row.profile.cost or {}).get("amount")) or 0.0 for row in rows)
    gpu_hours = sum(row.profile.gpu_seconds or 0.0 for row in rows if not row.profile.is_cpu) / 3600
    summary = (
        f"Task tries that stored a profile (XCom key <code>gpu_profile</code>) in the DAGs you may read, newest first, "
        f"at most {limit}: {len(rows)} shown, {e(fixed(gpu_hours, 'GPU-hours', 2))}"
        + (f", cost {e(f'{total_cost:.2f}')}" if total_cost else "")
        + "."
    )
    body = ["<h1>GPUs</h1>", f'<p class="meta">{summary}</p>']
    if not rows:
        body.append(
            '<p class="empty">No GPU task has reported a profile yet. GPU tasks of this provider push one when '
            "a try ends (unless <code>[gpu] profile = False</code>).</p>"
        )
        return layout("GPUs", "".join(body))
    body += [
        "<h2>Recent GPU tasks</h2>",
        table(
            [
                "Finished",
                "DAG / task",
                "Run",
                "Host",
                "Requested",
                "Assigned",
                "Peak memory",
                "Mean util",
                "Cost",
                "Advice",
            ],
            [_task_row(row, base) for row in rows],
            numeric=frozenset({6, 7}),
        ),
        "<h2>Hosts and models</h2>",
        table(
            ["Host", "Models", "Devices", "Tasks", "GPU-hours", "Last seen"],
            [
                [
                    e(name),
                    e(", ".join(f"{count}× {model}" for model, count in sorted(host.models.items())) or "–"),
                    e(len(host.devices)),
                    e(host.tasks),
                    e(f"{host.gpu_seconds / 3600:.2f}"),
                    e(when(host.last_seen or None)),
                ]
                for name, host in _hosts(rows).items()
            ],
            numeric=frozenset({2, 3, 4}),
        ),
    ]
    return layout("GPUs", "".join(body))

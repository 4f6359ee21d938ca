"""The GPUs page: the hosts and models first, the advice once per task, then the recent tries; filters on top.

Filters (``dag_id``, ``host``, ``model``, a GET form: no script runs here) narrow the newest tries of the DAGs the
user may read: the DAG in the database query, the host and the model among the tries read.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from airflow_gpu_provider.telemetry.profile import number
from airflow_gpu_provider.telemetry.ui.format import ProfileRow, TaskKey, fixed, gib, money, pct, requested, shared
from airflow_gpu_provider.telemetry.ui.html import e, layout, table, task_path, when

CPU_MODEL = "CPU"  # the model filter's name for tries without a GPU
TASK_COLUMNS = (
    *("Finished", "DAG / task", "State", "Run", "Host", "Requested", "Assigned", "Peak memory", "Mean util", "Cost"),
    "Advice",
)


class Filters(NamedTuple):
    """What the page shows: one DAG, host and model, or all (``None``)."""

    dag_id: str | None = None
    host: str | None = None
    model: str | None = None

    def keep(self, row: ProfileRow) -> bool:
        """Whether ``row`` passes the host and model filters (the DAG's is the query's)."""
        return (self.host is None or (row.profile.host or "") == self.host) and (
            self.model is None or self.model in models_of(row)
        )


def models_of(row: ProfileRow) -> set[str]:
    """The models a try ran on, as NVML names them; :data:`CPU_MODEL` for a CPU profile."""
    return {CPU_MODEL} if row.profile.is_cpu else {d.name or "GPU" for d in row.profile.devices}


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
    share = "a share of " if row.profile.share is not None else ""
    return share + (", ".join(f"{count}× {name}" for name, count in sorted(names.items())) or "–")


def _shares(rows: Sequence[ProfileRow], base: str) -> str:
    """The tries that held a share of a GPU, by host and GPU: who shared which GPU, when, and how it was enforced."""
    held = sorted(
        (row for row in rows if row.profile.share is not None),
        key=lambda row: (
            row.profile.host,
            row.profile.share.gpu if row.profile.share else "",
            row.profile.started or 0,
        ),
    )
    if not held:
        return ""
    return "<h2>Shared GPUs</h2>" + table(
        ["Host", "GPU", "Task", "Run", "Share", "From", "To"],
        [
            [
                e(row.profile.host or "–"),
                e(", ".join(d.name or "GPU" for d in row.profile.devices) or "–"),
                f'<a href="{e(task_path(base, row.key))}">{e(row.key.label)}</a>',
                e(row.key.run_id),
                e(shared(row.profile.share)) if row.profile.share is not None else "",
                f'<span class="nowrap">{e(when(row.profile.started))}</span>',
                f'<span class="nowrap">{e(when(row.profile.finished))}</span>',
            ]
            for row in held
        ],
    )


def _peak(row: ProfileRow) -> str:
    peak = row.profile.peak_memory
    share = row.profile.peak_memory_pct
    return "–" if peak is None else f"{gib(peak)}" + (f" ({pct(share)})" if share is not None else "")


def _task(key: TaskKey) -> TaskKey:
    """The task a try belongs to, whatever its run."""
    return TaskKey(key.dag_id, "", key.task_id, key.map_index)


def _advice_groups(rows: Sequence[ProfileRow]) -> dict[TaskKey, tuple[ProfileRow, int]]:
    """Per task with advice: its newest try with advice, and how many of the tries shown had advice."""
    groups: dict[TaskKey, tuple[ProfileRow, int]] = {}
    for row in rows:  # newest first
        if row.profile.advice:
            newest, count = groups.get(_task(row.key), (row, 0))
            groups[_task(row.key)] = (newest, count + 1)
    return groups


def _task_row(row: ProfileRow, base: str, anchor: int | None) -> list[str]:
    profile = row.profile
    kind = f' <span class="badge">{"CPU fallback" if profile.cpu_fallback else "CPU"}</span>' if profile.is_cpu else ""
    notes = len(profile.advice)
    return [
        f'<span class="nowrap">{e(when(profile.finished or row.stored))}</span>',
        f'<a href="{e(task_path(base, row.key))}">{e(row.key.label)}</a>{kind}',
        f'<span class="badge">{e(row.state)}</span>' if row.state not in (None, "success") else e(row.state or "–"),
        e(row.key.run_id),
        e(profile.host or "–"),
        e(requested(profile.requested)),
        e(_assigned(row)),
        e(_peak(row)),
        e(pct(profile.mean_util)),
        f'<span title="{e(money(profile.cost))}">{e(fixed(number((profile.cost or {}).get("amount")), "", 3))}</span>',
        f'<a href="#advice-{anchor}">{notes} note{"s" if notes > 1 else ""}</a>' if notes and anchor else "",
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


def _select(name: str, label: str, choices: Sequence[str], chosen: str | None) -> str:
    options = "".join(
        f'<option value="{e(value)}"{" selected" if value == chosen else ""}>{e(value)}</option>'
        for value in sorted({*choices, *([chosen] if chosen else [])})
    )
    return f'<label>{e(label)} <select name="{name}"><option value="">all</option>{options}</select></label> '


def _filter_form(read: Sequence[ProfileRow], dags: Sequence[str], filters: Filters, base: str, limit: int) -> str:
    hosts = [row.profile.host for row in read if row.profile.host]
    models = [model for row in read for model in models_of(row)]
    return (
        f'<form class="filters" method="get" action="{e(base)}/">'
        + _select("dag_id", "DAG", dags, filters.dag_id)
        + _select("host", "Host", hosts, filters.host)
        + _select("model", "Model", models, filters.model)
        + f'<input type="hidden" name="limit" value="{limit}"><button type="submit">Show</button> '
        + f'<a href="{e(base)}/">clear</a></form>'
    )


def render_overview(
    read: Sequence[ProfileRow],
    *,
    base: str,
    limit: int,
    filters: Filters | None = None,
    dags: Sequence[str] = (),
) -> str:
    """The whole GPUs page.

    :param read: the newest tries of the DAG filter's DAG (else of every DAG the user may read), newest first
    :param base: where the app is mounted; :param dags: the DAGs to choose from (with a profile, readable)
    """
    filters = filters or Filters()
    rows = [row for row in read if filters.keep(row)]
    total_cost = sum(number((row.profile.cost or {}).get("amount")) or 0.0 for row in rows)
    gpu_hours = sum(row.profile.gpu_seconds or 0.0 for row in rows if not row.profile.is_cpu) / 3600
    scope = ", ".join(f"{name} {value}" for name, value in zip(("DAG", "host", "model"), filters, strict=True) if value)
    summary = (
        f"Task tries that stored a profile (XCom key <code>gpu_profile</code>) in the DAGs you may read, newest first: "
        f"{len(rows)} of the {len(read)} newest (at most {limit})"
        + (f" with {e(scope)}" if scope else "")
        + f", {e(fixed(gpu_hours, 'GPU-hours', 2))}"
        + (f", cost {e(f'{total_cost:.2f}')}" if total_cost else "")
        + "."
    )
    body = ["<h1>GPUs</h1>", _filter_form(read, dags, filters, base, limit), f'<p class="meta">{summary}</p>']
    if not rows:
        body.append(
            '<p class="empty">No GPU task has reported a profile yet. GPU tasks of this provider push one when '
            "a try ends (unless <code>[gpu] profile_interval = 0</code>).</p>"
            if not read
            else '<p class="empty">No try matches these filters.</p>'
        )
        return layout("GPUs", "".join(body))
    groups = _advice_groups(rows)
    anchors = {task: number + 1 for number, task in enumerate(groups)}
    body += [
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
    if groups:
        body += [
            "<h2>Advice</h2>",
            '<p class="note">Once per task: what its newest try with advice says, and how many of the tries below '
            "had advice.</p>",
            table(
                ["Task", "Tries", "Advice (newest try)"],
                [
                    [
                        f'<a id="advice-{anchors[task]}" href="{e(task_path(base, newest.key))}">{e(task.label)}</a>',
                        e(count),
                        '<ul class="advice">'
                        + "".join(f"<li>{e(item)}</li>" for item in newest.profile.advice)
                        + "</ul>",
                    ]
                    for task, (newest, count) in groups.items()
                ],
                numeric=frozenset({1}),
            ),
        ]
    body.append(_shares(rows, base))
    body += [
        "<h2>Recent GPU tasks</h2>",
        table(
            list(TASK_COLUMNS),
            [_task_row(row, base, anchors.get(_task(row.key))) for row in rows],
            numeric=frozenset({7, 8}),
        ),
    ]
    return layout("GPUs", "".join(body))

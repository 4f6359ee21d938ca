"""The failure matrix's cells in lanes: one lane per kind of leftover reaper, each running its cells one at a time.

A backend's next task stops what its host's dead workers left (local: their processes; Docker: their containers and
builds; Ray: their jobs). Two cells of one backend at once could so hide each other's leftovers, or take the evidence
of the other's re-run; so each lane runs its cells one after the other, and the lanes run side by side: a local, a
Docker, a Ray and a Slurm cell at a time, none of which can see or stop the others' (leftovers.py counts each cell's own).
The Kubernetes cells (containers of their own label, which no reaper stops) share the local lane. The tests wait for
their cells' results in their own order while the lanes work ahead.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor

from reliability.matrix import NOT_RUN, Cell, run_cell
from reliability.places import Setup

LANES = {
    "local": "local",
    "kubernetes": "local",
    "docker": "docker",
    "docker-deferred": "docker",
    "ray": "ray",
    "slurm": "slurm",
}


class Lanes:
    """Runs cells in the lanes, each lane in a thread of its own, in the order given within a lane."""

    def __init__(self, setup: Setup) -> None:
        self.setup = setup
        self.missing: dict[str, BaseException] = {}  # by backend: why its cells cannot run here (its fixture's skip)
        self._lanes: dict[str, ThreadPoolExecutor] = {}
        self._cells: dict[tuple[str, str], Future[Cell]] = {}

    def start(self, cells: list[tuple[str, str]]) -> None:
        """Queue these cells in their lanes (a cell that is not run needs none)."""
        for backend, scenario in cells:
            if (backend, scenario) in NOT_RUN:
                continue
            name = LANES[backend]
            if name not in self._lanes:
                self._lanes[name] = ThreadPoolExecutor(1, thread_name_prefix=f"matrix-{name}")
            self._cells[backend, scenario] = self._lanes[name].submit(run_cell, backend, scenario, self.setup)

    def result(self, backend: str, scenario: str) -> Cell:
        """The cell, once it has run (at once for a cell that is not run)."""
        future = self._cells.get((backend, scenario))
        return run_cell(backend, scenario, self.setup) if future is None else future.result()

    def close(self) -> None:
        """Run no more cells; wait for those that run (each ends within the worker timeout)."""
        for lane in self._lanes.values():
            lane.shutdown(wait=True, cancel_futures=True)

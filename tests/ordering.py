"""The slowest test files first, one per xdist worker, so that the run does not end with one worker alone on a
trainer file it took up last.

``tests/durations.json`` lists the files that keep a worker busy longest (seconds of wall time, from a run's
``FINETUNE_TEST_CPU_LOG``: ``python -m tests.cpu_log <dir> --durations > tests/durations.json``). At collection the
listed files are dealt to the workers, heaviest first, each to the worker with the least work dealt so far, and put
at the head of the slice of the collection that worker is handed first (``--dist worksteal`` hands each worker one
contiguous slice, then moves tests from the tail of the longest queue to an idle worker: the light tests at the
tails move, the heavy files stay whole, so a file's module-scoped fixture is made once). Everything else keeps its
order. Kept simple on purpose: a file missing from the list (new, renamed) weighs nothing and only runs where it
always did; a listed file that is gone is ignored; a stale figure only places a file less well.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

DURATIONS = Path(__file__).with_name("durations.json")


def load_weights(path: Path = DURATIONS) -> dict[str, float]:
    """``{file: seconds}``; empty if the file is missing or not what it should be (the order is only a speed-up)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {str(name): float(seconds) for name, seconds in data.items() if isinstance(seconds, (int, float))}


def slice_sizes(total: int, workers: int) -> list[int]:
    """The sizes of the slices ``--dist worksteal`` first hands ``workers`` workers (xdist's own arithmetic)."""
    sizes = []
    for index in range(workers):
        size = total // (workers - index)
        sizes.append(size)
        total -= size
    return sizes


def heaviest_first(items: Sequence[pytest.Item], weights: Mapping[str, float], workers: int) -> list[pytest.Item]:
    """``items`` reordered: each worker's slice starts with its share of the listed files (whole, heaviest first)."""
    workers = max(workers, 1)
    files: dict[str, list[pytest.Item]] = {}
    for item in items:
        files.setdefault(item.nodeid.split("::")[0], []).append(item)
    heavy = sorted((name for name in files if weights.get(name, 0) > 0), key=lambda name: -weights[name])
    dealt: list[list[pytest.Item]] = [[] for _ in range(workers)]
    load = [0.0] * workers
    for name in heavy:
        worker = min(range(workers), key=lambda index: (load[index], index))
        dealt[worker].extend(files[name])
        load[worker] += weights[name]
    heavy_set = set(heavy)
    rest = [item for item in items if item.nodeid.split("::")[0] not in heavy_set]
    ordered: list[pytest.Item] = []
    for worker, size in enumerate(slice_sizes(len(items), workers)):
        ordered.extend(dealt[worker])
        fill = max(size - len(dealt[worker]), 0)
        ordered.extend(rest[:fill])
        del rest[:fill]
    ordered.extend(rest)
    return ordered


def worker_count(config: pytest.Config) -> int:
    """How many xdist workers share the collection (1 outside xdist)."""
    workerinput = getattr(config, "workerinput", None)
    return int(workerinput["workercount"]) if workerinput else 1


class HeaviestFirst:
    """The plugin: reorders after every other hook has selected and deselected (``-m``, ``-k``)."""

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        items[:] = heaviest_first(items, load_weights(), worker_count(config))

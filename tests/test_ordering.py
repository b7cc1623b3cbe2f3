"""The suite's own scheduling aid (tests/ordering.py): the heaviest files head the workers' slices, whole."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pytest

from tests.ordering import heaviest_first, load_weights, slice_sizes


@dataclass
class Item:
    nodeid: str


def collection(counts: dict[str, int]) -> list[Any]:
    return [Item(f"tests/{name}.py::t{index}") for name, count in counts.items() for index in range(count)]


def ids(items: list[Any]) -> list[str]:
    return [item.nodeid for item in items]


def test_each_worker_slice_starts_with_its_share_of_the_heavy_files_each_file_whole() -> None:
    items = collection({"a": 5, "b": 5, "heavy1": 2, "c": 5, "heavy2": 3, "heavy3": 1})
    weights = {"tests/heavy1.py": 300.0, "tests/heavy2.py": 200.0, "tests/heavy3.py": 150.0}
    ordered = ids(heaviest_first(cast(list[pytest.Item], items), weights, 2))
    first, second = ordered[: slice_sizes(21, 2)[0]], ordered[slice_sizes(21, 2)[0] :]
    assert first[:2] == ["tests/heavy1.py::t0", "tests/heavy1.py::t1"]
    assert second[:4] == [*(f"tests/heavy2.py::t{i}" for i in range(3)), "tests/heavy3.py::t0"]
    assert sorted(ordered) == sorted(ids(items))  # every test still runs, once
    rest = [nodeid for nodeid in ordered if "heavy" not in nodeid]
    assert rest == [nodeid for nodeid in ids(items) if "heavy" not in nodeid]  # the others keep their order


def test_slices_are_cut_as_xdist_cuts_them() -> None:
    assert slice_sizes(1206, 4) == [301, 301, 302, 302]
    assert slice_sizes(3, 4) == [0, 1, 1, 1]
    assert sum(slice_sizes(1000, 6)) == 1000


def test_without_a_list_or_outside_xdist_nothing_is_lost() -> None:
    items = collection({"a": 3, "b": 2})
    assert ids(heaviest_first(cast(list[pytest.Item], items), {}, 4)) == ids(items)
    ordered = heaviest_first(cast(list[pytest.Item], items), {"tests/b.py": 9.0, "tests/gone.py": 99.0}, 1)
    assert ids(ordered) == ["tests/b.py::t0", "tests/b.py::t1", "tests/a.py::t0", "tests/a.py::t1", "tests/a.py::t2"]


def test_a_missing_or_malformed_list_weighs_nothing(tmp_path: Path) -> None:
    assert load_weights(tmp_path / "absent.json") == {}
    (tmp_path / "bad.json").write_text("[1, 2")
    assert load_weights(tmp_path / "bad.json") == {}
    (tmp_path / "odd.json").write_text(json.dumps({"tests/a.py": 12, "tests/b.py": "slow"}))
    assert load_weights(tmp_path / "odd.json") == {"tests/a.py": 12.0}


def test_the_checked_in_list_loads() -> None:
    """Stale names are harmless (they weigh nothing), but an unreadable list would silently order nothing."""
    assert load_weights(), "tests/durations.json is missing, empty or malformed"

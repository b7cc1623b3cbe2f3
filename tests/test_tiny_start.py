"""How the tiny trainer starts: its heavy imports run with the garbage collector paused (``runner.hf.tiny``)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from runner.hf.tiny import collector_paused


@pytest.fixture
def unfrozen() -> Iterator[None]:
    """What a test freezes goes back to the collector afterwards: this worker goes on running other tests."""
    assert gc.isenabled() and gc.get_freeze_count() == 0
    yield
    gc.unfreeze()
    gc.enable()


def test_what_is_made_while_paused_is_never_collected_for_nothing_and_ends_frozen(unfrozen: None) -> None:
    runs_before = sum(generation["collections"] for generation in gc.get_stats())
    with collector_paused():
        assert not gc.isenabled()
        made = [[index] for index in range(50_000)]  # containers enough for dozens of collections, were it on
        assert sum(generation["collections"] for generation in gc.get_stats()) == runs_before
    assert gc.isenabled()
    assert gc.get_freeze_count() >= len(made)  # out of every later collection, the one at exit included


def test_the_collector_is_back_on_when_an_import_fails(unfrozen: None) -> None:
    with pytest.raises(ImportError), collector_paused():
        import runner.hf.no_such_module  # type: ignore[import-not-found]  # noqa: F401
    assert gc.isenabled()

"""How the tiny trainer starts: its heavy imports run with the garbage collector paused (``runner.hf.tiny``)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from runner.hf.tiny import collector_paused


@pytest.fixture
def collector_restored() -> Iterator[None]:
    """What a test freezes goes back to the collector afterwards, which is on again: this worker runs other tests
    (one of them may have frozen what it had before: ``bot.cli.serve`` does, in tests/test_supervision.py)."""
    yield
    gc.unfreeze()
    gc.enable()


def test_what_is_made_while_paused_is_never_collected_for_nothing_and_ends_frozen(collector_restored: None) -> None:
    frozen_before = gc.get_freeze_count()
    runs_before = sum(generation["collections"] for generation in gc.get_stats())
    with collector_paused():
        assert not gc.isenabled()
        made = [[index] for index in range(50_000)]  # containers enough for dozens of collections, were it on
        assert sum(generation["collections"] for generation in gc.get_stats()) == runs_before
    assert gc.isenabled()
    assert gc.get_freeze_count() >= frozen_before + len(made)  # out of every later collection, the last included


def test_the_collector_is_back_on_when_an_import_fails(collector_restored: None) -> None:
    assert gc.isenabled()
    with pytest.raises(ImportError), collector_paused():
        import runner.hf.no_such_module  # type: ignore[import-not-found]  # noqa: F401
    assert gc.isenabled()

"""A service loop that ends while the bot runs is a dead part of a live replica: logged CRITICAL, named, and
``finetune-bot serve`` exits 1 so that the platform replaces the replica. Loops that end once the bot stops are
no failure."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from bot.cli import serve
from bot.settings import Settings
from bot.supervision import Supervisor
from bot.timers import Timers


async def test_a_loop_that_ends_while_the_bot_runs_fails_the_replica_and_says_which(
    caplog: pytest.LogCaptureFixture,
) -> None:
    stopping = asyncio.Event()
    loops = Supervisor(stopping)
    broken = asyncio.Event()

    async def bus() -> None:
        await broken.wait()
        raise RuntimeError("'NoneType' object has no attribute 'writelines'")

    loops.start(bus(), "bus")
    loops.start(stopping.wait(), "timers")
    assert not loops.failed.is_set()
    broken.set()
    await asyncio.wait_for(loops.failed.wait(), 60)
    assert loops.cause == "bus RuntimeError: 'NoneType' object has no attribute 'writelines'"
    [record] = [r for r in caplog.records if r.levelno == logging.CRITICAL]
    assert "'bus'" in record.getMessage() and record.exc_info is not None
    stopping.set()
    await loops.wait()


async def test_loops_that_end_once_the_bot_stops_are_no_failure(caplog: pytest.LogCaptureFixture) -> None:
    stopping = asyncio.Event()
    loops = Supervisor(stopping)

    async def until_stopped() -> None:
        await stopping.wait()

    for name in ("bus", "timers", "chat-outbox"):
        loops.start(until_stopped(), name)
    stopping.set()
    await loops.wait()
    assert all(task.done() for task in loops.tasks) and len(loops.tasks) == 3
    assert not loops.failed.is_set() and loops.cause is None
    assert not [r for r in caplog.records if r.levelno == logging.CRITICAL]


@pytest.mark.scenario  # the whole service, its embedded Valkey and HTTP port (tests/markers.py)
async def test_serve_exits_1_when_a_service_loop_ends_by_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    async def fails(self: Timers, stop: asyncio.Event, interval: float = 0.5) -> None:
        raise RuntimeError("timers broke")  # a fault injected where a loop would end by itself

    monkeypatch.setattr(Timers, "run", fails)
    monkeypatch.delenv("REDIS_URL", raising=False)
    settings = Settings(finetune_state_dir=tmp_path / "state", finetune_http_port=0)
    assert await asyncio.wait_for(serve(settings), 300) == 1
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.CRITICAL]
    assert any("'timers'" in line for line in said) and any("timers RuntimeError: timers broke" in s for s in said)

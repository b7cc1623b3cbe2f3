"""The hang watchdog: the judge on an injected clock, the stacks it reads, a real hung trainer restarted by the real
runner (and a second hang that ends the attempt), and the bot's note and relaunch, counted towards the bound."""

from __future__ import annotations

import asyncio
import json
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from bot.chat.render import message_text
from handlers.change import Change
from handlers.decide import decide, new_job
from handlers.jobs import ChatRef, Job, JobState
from handlers.lifecycle import Lifecycle
from handlers.messages import Launched, Notify, RelaunchDue, ReportReceived, Terminate
from handlers.notes import HungNote
from handlers.recipes import TINY
from handlers.reports import Hung, Progress, Started, parse_report
from handlers.spec import HangRule, parse_spec
from handlers.spec_build import build_spec
from runner.hang_watch import HangJudge, save_in_flight, top_frames
from runner.manifest import COMPLETE_MARKER
from tests.runner_harness import of_type, read_reports, runner_env, start_runner, write_spec

RULE = HangRule(floor_seconds=2.0, factor=10.0)
# A small floor (the recipe's setting, as a test may set it): the tiny trainer's steps take ~0.1 s here.
TEST_HANG = {"floor_seconds": 3.0, "factor": 10.0}
T0 = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)


# -- the judge, on a clock of its own ---------------------------------------------------------------------------


def test_no_hang_before_the_first_step_however_long_the_start() -> None:
    judge = HangJudge(RULE, steps_seen=12, now=0.0)  # 12 lines are an earlier trainer's
    assert judge.observe(1_000.0, 12, 12, None) is None
    assert judge.observe(1_001.0, 13, 6, None) is None  # its first step: the watch starts now
    stall = judge.observe(1_003.0, 13, 6, None)
    assert stall is not None and stall.step == 6 and stall.seconds == 2.0 and stall.limit == 2.0


def test_the_limit_is_k_times_the_measured_step_time_above_the_floor() -> None:
    judge = HangJudge(RULE, steps_seen=0, now=0.0)
    for index in range(1, 6):  # one step every 3 s: the limit is 10 × 3 s
        assert judge.observe(3.0 * index, index, index, None) is None
    assert judge.step_seconds == pytest.approx(3.0) and judge.limit == pytest.approx(30.0)
    assert judge.observe(15.0 + 29.0, 5, 5, None) is None
    stall = judge.observe(15.0 + 30.0, 5, 5, None)
    assert stall is not None and stall.step == 5 and stall.seconds == pytest.approx(30.0)


def test_a_save_whose_files_move_is_no_hang_and_one_that_stopped_moving_is() -> None:
    judge = HangJudge(RULE, steps_seen=0, now=0.0)
    assert judge.observe(1.0, 1, 1, None) is None
    for second in range(2, 10):  # the save of step 1 writes for 8 s: its mark changes at every look
        assert judge.observe(float(second), 1, 1, ("checkpoint-1", second, 100 * second, second)) is None
    frozen = ("checkpoint-1", 9, 900, 9)
    assert judge.observe(10.0, 1, 1, frozen) is None
    stall = judge.observe(11.0, 1, 1, frozen)
    assert stall is not None and stall.seconds == 2.0


def test_the_save_in_flight_is_the_newest_unmarked_checkpoint_at_or_past_the_step(tmp_path: Path) -> None:
    assert save_in_flight(tmp_path, 3) is None
    done = tmp_path / "checkpoint-5"
    done.mkdir()
    (done / COMPLETE_MARKER).touch()
    assert save_in_flight(tmp_path, 7) is None  # complete
    writing = tmp_path / "checkpoint-10"
    writing.mkdir()
    (writing / "model.safetensors").write_bytes(b"x" * 10)
    mark = save_in_flight(tmp_path, 10)
    assert mark is not None and mark[:3] == ("checkpoint-10", 1, 10)
    assert save_in_flight(tmp_path, 11) is None  # an older, unmarked one is a killed trainer's leftover
    (writing / "optimizer.pt").write_bytes(b"y" * 5)
    assert save_in_flight(tmp_path, 10) != mark


def test_the_hanging_frames_come_from_the_main_thread_of_either_dump() -> None:
    faulthandler = (
        'Thread 0x00007f0000000001 (most recent call first):\n  File "/x/threading.py", line 331 in wait\n\n'
        'Current thread 0x00007f0000000002 (most recent call first):\n'
        '  File "/opt/runner/hf/tiny_training.py", line 92 in _hang_forever\n'
        '  File "/opt/runner/hf/tiny_training.py", line 110 in on_step_begin\n'
    )
    frames = top_frames(faulthandler)
    assert [(f.function, f.file, f.line) for f in frames] == [
        ("_hang_forever", "/opt/runner/hf/tiny_training.py", 92),
        ("on_step_begin", "/opt/runner/hf/tiny_training.py", 110),
    ]
    py_spy = (
        "Process 12: python -m runner.hf.tiny\nPython v3.12.3 (/usr/bin/python3.12)\n\n"
        'Thread 13 (idle): "pt_autograd_0"\n    wait (threading.py:331)\n'
        'Thread 12 (idle): "MainThread"\n    _hang_forever (runner/hf/tiny_training.py:92)\n'
        "    on_step_begin (runner/hf/tiny_training.py:110)\n"
    )
    assert [f.function for f in top_frames(py_spy)] == ["_hang_forever", "on_step_begin"]


def test_bad_hang_settings_are_refused_naming_the_field() -> None:
    for bad in ({"floor_seconds": 0}, {"factor": 1}, {"factor": "ten"}, {"floor": 120}):
        with pytest.raises(ValidationError):
            HangRule.model_validate(bad)
    assert TINY.hang == HangRule() and HangRule().limit(None) == 120.0 and HangRule().limit(30.0) == 300.0


def test_a_recipes_hang_settings_reach_the_runner_in_its_spec() -> None:
    recipe = TINY.model_copy(update={"hang": HangRule(floor_seconds=2.0, factor=20.0)})
    job = new_job("ft-hang2", "tiny", {}, "console:ana", None, T0).job
    spec = build_spec(job, 1, recipe, "file:///tmp/ckpt/", [], "none", sys.executable)
    assert parse_spec(spec.model_dump_json()).hang == HangRule(floor_seconds=2.0, factor=20.0)
    assert build_spec(job, 1, TINY, "file:///tmp/ckpt/", [], "none", sys.executable).hang == HangRule()


# -- the bot's side ---------------------------------------------------------------------------------------------


def running_job(attempts_without_progress: int = 0) -> Job:
    job = new_job("ft-hang1", "tiny", {"steps": 20}, "console:ana", ChatRef(platform="console", channel="c"), T0).job
    launched = Launched(job_id=job.id, attempt=1, instance_id="i-1", zone="z", price_per_hour=0.5)
    job = decide(job, launched, T0 + timedelta(seconds=1)).job
    job = decide(job, ReportReceived(report=Started(job_id=job.id, attempt=1)), T0 + timedelta(seconds=5)).job
    progress = Progress(job_id=job.id, attempt=1, step=7, total_steps=20)
    job = decide(job, ReportReceived(report=progress), T0 + timedelta(seconds=6)).job
    return job.model_copy(update={"attempts_without_progress": attempts_without_progress})


def hung_notes(change: Change) -> list[Notify]:
    return [item for item in change.outbox if isinstance(item, Notify) and isinstance(item.note, HungNote)]


def told(job: Job, report: dict[str, Any], lifecycle: Lifecycle | None = None) -> tuple[Change, str, str]:
    """The bot's decision on a runner's hung report (as it came over the wire), and its note in both languages."""
    hung = parse_report({**report, "job_id": job.id, "attempt": job.attempt})
    assert isinstance(hung, Hung)
    change = decide(job, ReportReceived(report=hung), T0 + timedelta(seconds=30), lifecycle=lifecycle)
    assert change is not None
    [note] = hung_notes(change)  # one note, in the job's thread
    assert note.channel == "thread"
    return change, message_text(change.job, note, T0, "en"), message_text(change.job, note, T0, "zh-CN")


def test_a_second_hang_relaunches_elsewhere_and_counts_towards_the_bound() -> None:
    report = {"type": "hung", "step": 7, "seconds": 130.0, "limit_seconds": 120.0, "ends_attempt": True}
    change, english, _ = told(running_job(), report)
    assert change.job.state is JobState.RECOVERING and change.job.attempt == 2
    assert change.job.attempts[0].end_reason is not None and "hung twice" in change.job.attempts[0].end_reason
    assert change.job.attempts_without_progress == 1  # it trained past its start, and still counts
    assert "relaunching on another" in english
    # Counted, it relaunches after the bound's pause (a relaunch without progress waits), on a new instance: the old
    # one is released.
    [due] = [item for item in change.outbox if isinstance(item, RelaunchDue)]
    assert due.attempt == 2 and due.due == T0 + timedelta(seconds=30 + 30)
    assert [item.instance_id for item in change.outbox if isinstance(item, Terminate)] == ["i-1"]

    # The bound: one relaunch without progress allowed, one had already: this hang ends the job instead (its failure
    # says so, not a note that promises a relaunch).
    bounded = Lifecycle(max_relaunches_without_progress=1)
    job = running_job(attempts_without_progress=1)
    hung = parse_report({**report, "job_id": job.id, "attempt": job.attempt})
    ended = decide(job, ReportReceived(report=hung), T0 + timedelta(seconds=30), lifecycle=bounded)
    assert ended is not None and ended.job.state is JobState.FAILED and not hung_notes(ended)
    failure = ended.job.failure
    assert failure is not None and failure.code == "no-progress" and failure.values["count"] == 2
    last = failure.values["last"]
    assert not isinstance(last, str | int | float) and last.code == "hung" and "at step 7" in failure.english


def test_a_first_hang_is_a_note_and_moves_nothing() -> None:
    job = running_job()
    report = {"type": "hung", "step": 7, "seconds": 3.4, "limit_seconds": 3.0, "restart_from": 5}
    change, english, chinese = told(job, report)
    assert change.job.state is JobState.RUNNING and change.job.attempt == 1
    assert "step 7" in english and "checkpoint of step 5" in english and "No stack" in english
    assert "第 7 步" in chinese


# -- the real runner and a real hung trainer ---------------------------------------------------------------------


def hang_spec(tmp_path: Path, store: Path, reports: Path, hangs: int) -> Path:
    command = [
        sys.executable, "-m", "runner.hf.tiny", "--max-steps", "12", "--save-steps", "5",
        "--step-seconds", "0.1", "--hang-after-step", "7", "--hangs", str(hangs),
    ]  # fmt: skip
    return write_spec(
        tmp_path / "spec.json",
        checkpoint_uri=f"file://{store}/",
        report=[f"file://{reports}"],
        command=command,
        hang=TEST_HANG,
    )


def trained_steps(work: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (work / "progress.jsonl").read_text().splitlines()]


async def test_a_hung_trainer_is_restarted_from_the_newest_checkpoint_and_the_job_finishes(tmp_path: Path) -> None:
    store, reports, work = tmp_path / "store", tmp_path / "reports.jsonl", tmp_path / "work"
    runner = await start_runner(hang_spec(tmp_path, store, reports, hangs=1), work, runner_env())
    assert await asyncio.wait_for(runner.wait(), 300) == 0

    got = read_reports(reports)
    [hung] = of_type(got, "hung")
    assert hung["step"] == 7 and hung["restart_from"] == 5 and hung["ends_attempt"] is False
    assert hung["seconds"] >= hung["limit_seconds"] >= TEST_HANG["floor_seconds"]
    assert hung["ranks"] == 1 and hung["frames"][0]["function"] == "_hang_forever"
    assert hung["frames"][0]["file"].endswith("tiny_training.py")
    steps = trained_steps(work)  # 6 and 7 trained twice: before the hang, and after the restart from 5
    assert steps.count(5) == 1 and steps.count(6) == 2 and steps.count(7) == 2 and steps[-1] == 12
    assert of_type(got, "completed")[0]["step"] == 12
    assert (store / "output" / "adapter_model.safetensors").exists()

    # What the bot makes of it: one note in the job's thread with the step and the hanging function.
    _, english, chinese = told(running_job(), {k: v for k, v in hung.items() if k not in ("job_id", "attempt")})
    assert "hung at step 7" in english and "_hang_forever (" in english and "checkpoint of step 5" in english
    assert "第 7 步" in chinese and "_hang_forever" in chinese


async def test_a_second_hang_in_the_attempt_ends_it_with_the_reason(tmp_path: Path) -> None:
    store, reports, work = tmp_path / "store", tmp_path / "reports.jsonl", tmp_path / "work"
    runner = await start_runner(hang_spec(tmp_path, store, reports, hangs=2), work, runner_env())
    assert await asyncio.wait_for(runner.wait(), 300) == 75  # the attempt ended early on purpose: the job moves

    got = read_reports(reports)
    first, second = of_type(got, "hung")
    assert first["ends_attempt"] is False and first["restart_from"] == 5
    assert second["ends_attempt"] is True and second["step"] == 7 and second["restart_from"] is None
    assert second["frames"][0]["function"] == "_hang_forever"
    assert got[-1]["type"] == "hung" and not of_type(got, "completed") and not of_type(got, "failed")
    assert (store / "checkpoint-5" / "MANIFEST.json").exists()  # committed for the next instance to resume

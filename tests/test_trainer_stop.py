"""The stop request reaches the process that trains, however it was launched; a trainer that cannot start fails.

Small trainers without torch, run by the real runner: a wrapper that swallows signals (as ``swift sft`` does,
running the real trainer in a child), a trainer whose rank sits in a session of its own (as torchrun's ranks do),
and trainers that cannot be started at all.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bot.cloud.local.metadata import LocalMetadataServer
from handlers.failures import Failure
from tests.runner_harness import of_type, progress_steps, read_reports, runner_env, start_runner, write_spec

# Run with -S from a directory without the project: ``runner`` is importable only through the PYTHONPATH the
# runner gives its trainer, as for a trainer installed in another Python environment.
CHILD = """
import json, os, pathlib, signal, time
from runner.stop_request import StopRequest
stop = StopRequest(install_signal_handler=False)
signal.signal(signal.SIGTERM, lambda *a: pathlib.Path('child-got-sigterm').touch())
progress = pathlib.Path(os.environ['FINETUNE_PROGRESS_FILE'])
step = 0
while True:
    step += 1
    time.sleep(0.05)
    with progress.open('a') as fh:
        fh.write(json.dumps({'step': step, 'total_steps': 100000}) + '\\n')
    if stop.agreed():
        break
ckpt = pathlib.Path(os.environ['FINETUNE_OUTPUT_DIR']) / ('checkpoint-%d' % step)
ckpt.mkdir(parents=True)
(ckpt / 'weights.bin').write_bytes(b'w' * 100)
(ckpt / '.finetune-complete').touch()
"""

# Like `swift sft`: runs the trainer as a child, forwards no signal, and would die of a SIGTERM itself.
WRAPPER = f"""
import pathlib, subprocess, sys
code = subprocess.run([sys.executable, '-S', '-c', {CHILD!r}]).returncode
pathlib.Path('wrapper-exit').write_text(str(code))
sys.exit(code)
"""


@pytest.fixture
async def imds() -> AsyncIterator[LocalMetadataServer]:
    server = await LocalMetadataServer(instance_id="i-0wrapped").start()
    yield server
    await server.stop()


async def until(condition: object, timeout: float = 120.0) -> None:
    assert callable(condition)
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


async def test_a_trainer_behind_a_wrapper_that_drops_signals_saves_the_step_it_is_at(
    tmp_path: Path, imds: LocalMetadataServer
) -> None:
    store, reports, work = tmp_path / "store", tmp_path / "reports.jsonl", tmp_path / "work"
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    spec = write_spec(
        tmp_path / "spec.json",
        checkpoint_uri=f"file://{store}/",
        report=[f"file://{reports}"],
        notice="aws",
        command=[sys.executable, "-S", "-c", WRAPPER],
    )
    env = runner_env(AWS_EC2_METADATA_SERVICE_ENDPOINT=imds.endpoint, FINETUNE_SYNC_SECONDS="600")
    runner = await start_runner(spec, work, env, cwd=cwd)
    await until(lambda: (work / "stop-request.watched").exists() and len(progress_steps(work / "progress.jsonl")) >= 3)
    imds.interrupt(seconds=60)
    assert await asyncio.wait_for(runner.wait(), 120) == 75

    got = read_reports(reports)
    [interrupted] = of_type(got, "interrupted")
    assert interrupted["saved_in_time"] is True
    assert interrupted["step"] == progress_steps(work / "progress.jsonl")[-1]
    assert (store / f"checkpoint-{interrupted['step']}" / "MANIFEST.json").exists()
    assert (cwd / "wrapper-exit").read_text() == "0"  # the wrapper was not signalled: it saw its child finish
    assert not (cwd / "child-got-sigterm").exists()


async def test_a_missing_trainer_program_is_one_failed_report_and_exit_1(tmp_path: Path) -> None:
    reports = tmp_path / "reports.jsonl"
    spec = write_spec(
        tmp_path / "spec.json",
        checkpoint_uri=f"file://{tmp_path}/store/",
        report=[f"file://{reports}"],
        command=["finetune-no-such-trainer", "sft", "--model", "x"],
    )
    runner = await start_runner(spec, tmp_path / "work", runner_env())
    assert await asyncio.wait_for(runner.wait(), 60) == 1
    [failed] = read_reports(reports)
    assert failed["type"] == "failed"
    said = Failure.model_validate(failed["failure"]).english
    assert said.startswith("cannot start the trainer: 'finetune-no-such-trainer' not found on PATH")
    assert failed["failure"]["code"] == "trainer-not-on-path"  # the code the bot words
    assert failed["failure"]["values"]["program"] == "finetune-no-such-trainer"
    assert not (tmp_path / "store").exists()  # nothing restored, nothing written


async def test_a_trainer_program_that_cannot_be_executed_is_reported_failed(tmp_path: Path) -> None:
    program = tmp_path / "trainer"
    program.write_bytes(b"\x7fELF not really\n")  # executable bit, but no format exec knows
    program.chmod(0o755)
    reports = tmp_path / "reports.jsonl"
    spec = write_spec(
        tmp_path / "spec.json",
        checkpoint_uri=f"file://{tmp_path}/store/",
        report=[f"file://{reports}"],
        command=[str(program)],
    )
    runner = await start_runner(spec, tmp_path / "work", runner_env())
    assert await asyncio.wait_for(runner.wait(), 60) == 1
    got = read_reports(reports)
    assert [r["type"] for r in got] == ["started", "failed"]
    said = Failure.model_validate(got[1]["failure"]).english
    assert said == f"cannot start the trainer {str(program)!r}: Exec format error"
    assert got[1]["failure"] == {
        "code": "trainer-not-started",
        "values": {"program": str(program), "error": "Exec format error"},  # the system's words, as given
    }


async def test_a_trainer_that_crashes_at_once_is_reported_failed_with_its_last_words(tmp_path: Path) -> None:
    reports = tmp_path / "reports.jsonl"
    spec = write_spec(
        tmp_path / "spec.json",
        checkpoint_uri=f"file://{tmp_path}/store/",
        report=[f"file://{reports}"],
        command=[sys.executable, "-c", "import swift_not_installed_here"],
        max_restarts=0,
    )
    runner = await start_runner(spec, tmp_path / "work", runner_env())
    assert await asyncio.wait_for(runner.wait(), 60) == 1
    got = read_reports(reports)
    assert [r["type"] for r in got] == ["started", "failed"]
    failed = got[1]
    assert failed["exit_code"] == 1
    last = "ModuleNotFoundError: No module named 'swift_not_installed_here'"
    said = Failure.model_validate(failed["failure"]).english
    assert said == f"trainer exited with code 1; gave up after 0 restart(s): {last}"
    assert failed["failure"] == {"code": "trainer-exited", "values": {"exit_code": 1, "restarts": 0, "line": last}}
    assert failed["log_tail"][0] == "Traceback (most recent call last):" and failed["log_tail"][-1] == last


# Ignores SIGTERM and starts a "rank" in a session of its own (as torchrun does), which never stops either.
STUBBORN_WITH_RANK = [
    sys.executable,
    "-c",
    "import os, pathlib, signal, subprocess, sys, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "rank = subprocess.Popen([sys.executable, '-c', 'import signal, time; "
    "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)'], start_new_session=True)\n"
    "pathlib.Path(os.environ['FINETUNE_OUTPUT_DIR'], 'rank.pid').write_text(str(rank.pid))\n"
    "time.sleep(600)",
]


async def test_past_the_deadline_the_trainer_and_its_ranks_in_other_sessions_are_killed(
    tmp_path: Path, imds: LocalMetadataServer
) -> None:
    reports, work = tmp_path / "reports.jsonl", tmp_path / "work"
    spec = write_spec(
        tmp_path / "spec.json",
        checkpoint_uri=f"file://{tmp_path}/store/",
        report=[f"file://{reports}"],
        notice="aws",
        command=STUBBORN_WITH_RANK,
    )
    runner = await start_runner(spec, work, runner_env(AWS_EC2_METADATA_SERVICE_ENDPOINT=imds.endpoint))
    rank_pid = work / "output" / "rank.pid"
    await until(lambda: rank_pid.exists() and rank_pid.read_text() != "")
    rank = int(rank_pid.read_text())
    imds.interrupt(seconds=6)
    assert await asyncio.wait_for(runner.wait(), 60) == 75
    [interrupted] = of_type(read_reports(reports), "interrupted")
    assert interrupted["saved_in_time"] is False
    await until(lambda: not _alive(rank), timeout=30)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead: it only waits for its (re)parent to reap it.
    stat = Path(f"/proc/{pid}/stat").read_bytes()
    return stat[stat.rfind(b")") + 2 :].split()[0] != b"Z"

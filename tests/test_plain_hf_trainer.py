"""A plain Hugging Face ``Trainer`` script that saves itself on SIGTERM (``enable_jit_checkpoint``), run by the real
runner with no callback of ours and no progress file (``tests/trainers/plain_hf_trainer.py``).

A notice between periodic saves: the runner sends SIGTERM at once, commits the checkpoint Hugging Face wrote on it
(complete by Hugging Face's own sign: ``trainer_state.json`` written and its in-progress sentinel gone), reports the
step it holds as the step reached, and the next attempt resumes from it. A notice too short for any save: the
complete periodic checkpoint is committed (it carries no marker of ours) and the step reached is unknown, not the
committed one.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bot.cloud.local.metadata import LocalMetadataServer
from tests.runner_harness import of_type, read_reports, runner_env, start_runner, wait_until, write_spec

SCRIPT = Path(__file__).parent / "trainers" / "plain_hf_trainer.py"


def plain_command(max_steps: int) -> list[str]:
    return [
        *(sys.executable, str(SCRIPT), "--output_dir", "${FINETUNE_OUTPUT_DIR}"),
        *("--resume_from_checkpoint", "${FINETUNE_RESUME_FROM}"),
        *("--save_steps", "10", "--max_steps", str(max_steps), "--enable_jit_checkpoint"),
        *("--per_device_train_batch_size", "4", "--use_cpu", "--report_to", "none", "--disable_tqdm", "true"),
    ]


@pytest.fixture
async def imds() -> AsyncIterator[LocalMetadataServer]:
    server = await LocalMetadataServer(instance_id="i-0plainhf").start()
    yield server
    await server.stop()


def plain_spec(tmp_path: Path, attempt: int, step_sleep: str, notice: str = "aws") -> Path:
    store, reports = tmp_path / "store", tmp_path / f"reports-{attempt}.jsonl"
    return write_spec(
        tmp_path / f"spec-{attempt}.json",
        attempt=attempt,
        checkpoint_uri=f"file://{store}/",
        report=[f"file://{reports}"],
        notice=notice,
        command=plain_command(200),
        env={"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "STEP_SLEEP": step_sleep},
        max_restarts=0,
    )


def stored_global_step(store: Path, step: int) -> int:
    return int(json.loads((store / f"checkpoint-{step}" / "trainer_state.json").read_text())["global_step"])


async def test_a_notice_between_saves_commits_the_save_hugging_face_made_on_sigterm_and_the_job_resumes_from_it(
    tmp_path: Path, imds: LocalMetadataServer
) -> None:
    store, work = tmp_path / "store", tmp_path / "work"
    env = runner_env(AWS_EC2_METADATA_SERVICE_ENDPOINT=imds.endpoint)
    runner = await start_runner(plain_spec(tmp_path, 1, step_sleep="0.1"), work, env)
    # Committed by the periodic sync though it carries no marker of ours: Hugging Face's own sign says complete.
    await wait_until(lambda: (store / "checkpoint-10" / "MANIFEST.json").exists(), timeout=300)
    assert not (work / "output" / "checkpoint-10" / ".finetune-complete").exists()
    imds.interrupt(seconds=40)
    assert await asyncio.wait_for(runner.wait(), 120) == 75

    [interrupted] = of_type(read_reports(tmp_path / "reports-1.jsonl"), "interrupted")
    step = interrupted["step"]
    assert step > 10  # past the periodic save at the notice: the one Hugging Face made on SIGTERM
    assert interrupted["fresh_save"] == "committed" and interrupted["saved_in_time"] is True
    assert interrupted["reached_step"] == step == stored_global_step(store, step)  # no progress file: HF's word
    assert (store / f"checkpoint-{step}" / "MANIFEST.json").exists()
    assert not (store / f"checkpoint-{step}" / "checkpoint-is-incomplete.txt").exists()

    second = await start_runner(plain_spec(tmp_path, 2, step_sleep="0", notice="none"), tmp_path / "work-2", env)
    assert await asyncio.wait_for(second.wait(), 300) == 0
    reports = read_reports(tmp_path / "reports-2.jsonl")
    [started] = of_type(reports, "started")
    assert started["resumed_from_step"] == step
    [completed] = of_type(reports, "completed")
    assert (store / "output" / "model.safetensors").exists() and completed["output_uri"]


async def test_a_notice_too_short_for_any_save_commits_the_complete_periodic_checkpoint_and_the_step_is_unknown(
    tmp_path: Path, imds: LocalMetadataServer
) -> None:
    store, work = tmp_path / "store", tmp_path / "work"
    # No periodic commit before the notice: the notice path itself must see that checkpoint-10 is complete.
    env = runner_env(AWS_EC2_METADATA_SERVICE_ENDPOINT=imds.endpoint, FINETUNE_SYNC_SECONDS="600")
    runner = await start_runner(plain_spec(tmp_path, 1, step_sleep="0.1"), work, env)
    await wait_until(lambda: (work / "output" / "checkpoint-10" / "trainer_state.json").exists(), timeout=300)
    assert not (store / "checkpoint-10").exists()
    imds.interrupt(seconds=5)  # ~3 s to the cutoff: no save fits (~3.3 s with margin) even at the assumed rate
    assert await asyncio.wait_for(runner.wait(), 120) == 75

    [interrupted] = of_type(read_reports(tmp_path / "reports-1.jsonl"), "interrupted")
    step = interrupted["step"]
    assert step is not None and step % 10 == 0  # the newest periodic save, committed on the notice
    assert (store / f"checkpoint-{step}" / "MANIFEST.json").exists()
    assert stored_global_step(store, step) == step
    assert interrupted["fresh_save"] != "committed" and interrupted["saved_in_time"] is False
    assert interrupted["reached_step"] is None  # it writes no progress and saved nothing fresh: unknown, not `step`

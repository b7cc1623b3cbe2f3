"""A notice that meets a periodic save: the trainer trains no step past the one committed.

The real runner, a real trainer subprocess and moto S3 behind a proxy that can slow the link. The notice is sent
once the periodic checkpoint's directory is on the disk and not yet complete, so it lands mid-save:

* a trainer that only handles SIGTERM, with time to spare: it is asked at once, finishes the save in flight,
  trains one step and saves that one; the step it stopped at is the step committed;
* the same trainer with no time for a second save: it is held (frozen) as soon as the save in flight is complete,
  so it trains nothing that could not be committed, and that save is committed;
* the HF Trainer with the callback: it stops right after the save in flight (no step more, no second save).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from bot.cloud.local.metadata import LocalMetadataServer
from runner.manifest import COMPLETE_MARKER
from runner.storage.s3 import MiB
from tests.runner_harness import (
    of_type,
    progress_steps,
    read_reports,
    runner_env,
    start_runner,
    take_instance,
    wait_until,
    write_spec,
)
from tests.s3_proxy import S3FaultProxy

BUCKET = "save-bucket"
URI = f"s3://{BUCKET}/jobs/ft-test/"


@pytest.fixture
def s3(aws: str) -> Iterator[Any]:
    client = boto3.client("s3", endpoint_url=aws)
    client.create_bucket(Bucket=BUCKET)
    yield client


@pytest.fixture
async def imds() -> AsyncIterator[LocalMetadataServer]:
    server = await LocalMetadataServer(instance_id="i-0saving").start()
    yield server
    await server.stop()


def committed_steps(s3: Any) -> list[int]:
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix="jobs/ft-test/")
    keys = [item["Key"] for page in pages for item in page.get("Contents", [])]
    return sorted(int(key.split("/")[2].split("-")[1]) for key in keys if key.endswith("/MANIFEST.json"))


# 64 MiB written at 16 MiB/s (a 4 s save) at step 3; steps of 1 s. SIGTERM: save at the end of the next step.
SIGTERM_ONLY = [
    sys.executable,
    "-m",
    "tests.trainers.synthetic",
    *("--checkpoint-mib", "64", "--write-mib-per-second", "16", "--save-at", "3", "--step-seconds", "1"),
]


async def notice_mid_save(
    tmp_path: Path, proxy: S3FaultProxy, imds: LocalMetadataServer, command: list[str], step: int, seconds: float
) -> tuple[list[dict[str, Any]], Path]:
    """Run attempt 1 until checkpoint-``step`` is being written, send the notice, let the machine go."""
    reports, work = tmp_path / "reports.jsonl", tmp_path / "work"
    spec = write_spec(
        tmp_path / "spec.json", checkpoint_uri=URI, report=[f"file://{reports}"], notice="aws", command=command
    )
    env = runner_env(
        AWS_ENDPOINT_URL=proxy.endpoint,
        AWS_EC2_METADATA_SERVICE_ENDPOINT=imds.endpoint,
        FINETUNE_S3_PART_MIB="5",
        FINETUNE_REPORT_RESERVE_SECONDS="3",
    )
    runner = await start_runner(spec, work, env, new_session=True)
    try:
        saving = work / "output" / f"checkpoint-{step}"
        await wait_until(lambda: saving.is_dir(), timeout=300)
        assert not (saving / COMPLETE_MARKER).exists()  # mid-save: the notice meets it
        await take_instance(runner, imds.interrupt(seconds=seconds))
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(runner.pid, signal.SIGKILL)
    return read_reports(reports), work


async def test_a_sigterm_trainer_with_time_to_spare_saves_the_next_step_and_that_is_committed(
    tmp_path: Path, s3: Any, proxy: S3FaultProxy, imds: LocalMetadataServer
) -> None:
    got, work = await notice_mid_save(tmp_path, proxy, imds, SIGTERM_ONLY, step=3, seconds=60)
    [interrupted] = of_type(got, "interrupted")
    trained = progress_steps(work / "progress.jsonl")
    assert trained[-1] == 4  # it finished the save in flight, trained one step, and saved that (asked for)
    assert interrupted["fresh_save"] == "committed" and interrupted["saved_in_time"] is True
    assert interrupted["step"] == interrupted["reached_step"] == 4
    assert 4 in committed_steps(s3)


async def test_a_sigterm_trainer_with_no_time_for_a_second_save_is_held_after_the_save_in_flight(
    tmp_path: Path, s3: Any, proxy: S3FaultProxy, imds: LocalMetadataServer
) -> None:
    # 4 MiB/s: checkpoint-3 goes up in ~16 s, within the 27 s before the report; a fresh save behind it would
    # need 128 MiB more of upload (x1.25 + 2 s): it does not fit, so no SIGTERM that would start it.
    proxy.upload_rate = 4 * MiB
    got, work = await notice_mid_save(tmp_path, proxy, imds, SIGTERM_ONLY, step=3, seconds=30)
    [interrupted] = of_type(got, "interrupted")
    assert progress_steps(work / "progress.jsonl")[-1] == 3  # no step trained past the one committed
    assert not (work / "output" / "checkpoint-4").exists()  # and no save started that could not finish
    assert interrupted["step"] == interrupted["reached_step"] == 3 and interrupted["saved_in_time"] is True
    assert interrupted["fresh_save"] == "not-asked" and interrupted["late"]["why"] == "too-slow"
    assert committed_steps(s3) == [3]


async def test_the_hf_callback_stops_right_after_the_save_in_flight(
    tmp_path: Path, s3: Any, proxy: S3FaultProxy, imds: LocalMetadataServer
) -> None:
    # The tiny HF Trainer saves every 3 steps; each save takes 4 s more before it is complete.
    command = [
        sys.executable,
        "-m",
        "runner.hf.tiny",
        *("--max-steps", "30", "--save-steps", "3", "--save-seconds", "4", "--step-seconds", "0.5"),
    ]
    got, work = await notice_mid_save(tmp_path, proxy, imds, command, step=3, seconds=20)
    [interrupted] = of_type(got, "interrupted")
    assert progress_steps(work / "progress.jsonl")[-1] == 3
    assert not (work / "output" / "checkpoint-4").exists()
    assert interrupted["fresh_save"] == "committed" and interrupted["saved_in_time"] is True
    assert interrupted["step"] == interrupted["reached_step"] == 3
    assert committed_steps(s3) == [3]
    summary = [json.loads(line) for line in (work / "trainer.log").read_text().splitlines() if line.startswith('{"')]
    assert summary and summary[-1]["interrupted"] is True  # it stopped on the request, and wrote no final output

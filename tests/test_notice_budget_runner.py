"""The runner measures what a notice-driven commit takes at its first periodic save, and reports it: the real runner,
the synthetic trainer writing its checkpoint at a set pace, moto S3 behind a proxy that sets the link's rate."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import boto3

from handlers.reports import CheckpointSaved, parse_report
from runner.storage.s3 import MiB
from tests.runner_harness import runner_env, start_runner, wait_for_report, write_spec
from tests.s3_proxy import S3FaultProxy

BUCKET = "budget-bucket"
URI = f"s3://{BUCKET}/jobs/ft-test/"
# 12 MiB written at 6 MiB/s (a save of at least 2 s) at step 3, then 57 more steps of 0.2 s: the periodic commit
# (about 1.5 s through the 8 MiB/s link) has the rest of the run to finish, on a busy machine too (a run that ended
# first would complete with no periodic report at all).
COMMAND = [
    sys.executable,
    "-m",
    "tests.trainers.synthetic",
    *("--checkpoint-mib", "12", "--write-mib-per-second", "6", "--save-at", "3"),
    *("--step-seconds", "0.2", "--max-steps", "60"),
]


async def test_the_first_periodic_save_reports_the_save_time_and_the_upload_rate(
    tmp_path: Path, proxy: S3FaultProxy
) -> None:
    boto3.client("s3", endpoint_url=proxy.upstream).create_bucket(Bucket=BUCKET)
    proxy.upload_rate = 8 * MiB  # the link: no upload goes faster
    reports = tmp_path / "reports.jsonl"
    spec = write_spec(tmp_path / "spec.json", checkpoint_uri=URI, report=[f"file://{reports}"], command=COMMAND)
    runner = await start_runner(spec, tmp_path / "work", runner_env(AWS_ENDPOINT_URL=proxy.endpoint))
    try:
        raw = await wait_for_report(reports, lambda r: r["type"] == "checkpoint_saved", timeout=300)
        saved: Any = parse_report(raw)  # the wire's schema, as the bot reads it
        assert isinstance(saved, CheckpointSaved) and saved.reason == "periodic" and saved.step == 3
        assert saved.bytes >= 12 * MiB
        # First sight of the directory to its completion: the paced write, less at most one look (0.2 s).
        assert saved.save_seconds is not None and saved.save_seconds >= 1.5
        # Bytes per second of the time an upload was in flight: measured, and within what the link allows.
        assert saved.upload_bytes_per_second is not None and 0 < saved.upload_bytes_per_second <= 8 * MiB * 1.05
        assert await asyncio.wait_for(runner.wait(), 300) == 0
    finally:
        if runner.returncode is None:
            runner.kill()
            await runner.wait()

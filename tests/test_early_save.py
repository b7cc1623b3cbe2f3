"""An early signal only the bot heard (an Alibaba scheduled system event) reaches the real runner as a save request
in its control object: a fresh checkpoint is committed and the trainer trains on to the end; a trainer that does
not honour save requests gets its newest checkpoint committed instead."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import boto3
import pytest

from handlers.spec import SaveControl, dump_control
from tests.runner_harness import (
    of_type,
    read_reports,
    runner_env,
    start_runner,
    tiny_command,
    wait_for_report,
    write_spec,
)

BUCKET = "early-bucket"
URI = f"s3://{BUCKET}/jobs/ft-test/"
CONTROL = "jobs/ft-test/control/attempt-1.json"

# A trainer of the older contract: it saves every 5 steps and knows nothing of save requests.
PERIODIC_ONLY = """
import json, os, pathlib, time
out = pathlib.Path(os.environ['FINETUNE_OUTPUT_DIR'])
progress = pathlib.Path(os.environ['FINETUNE_PROGRESS_FILE'])
for step in range(1, 61):
    time.sleep(0.1)
    with progress.open('a') as file:
        file.write(json.dumps({'step': step, 'total_steps': 60}) + '\\n')
    if step % 5 == 0:
        ckpt = out / ('checkpoint-%d' % step)
        ckpt.mkdir(parents=True)
        (ckpt / 'state.json').write_text(json.dumps({'step': step}))
        (ckpt / '.finetune-complete').touch()
(out / 'done.txt').write_text('done')
"""


@pytest.fixture
def s3(aws: str) -> Iterator[Any]:
    client = boto3.client("s3", endpoint_url=aws)
    client.create_bucket(Bucket=BUCKET)
    yield client


def keys(s3: Any) -> list[str]:
    listed = s3.list_objects_v2(Bucket=BUCKET, Prefix="jobs/ft-test/").get("Contents", [])
    return [item["Key"].removeprefix("jobs/ft-test/") for item in listed]


def ask_to_save(s3: Any) -> None:
    """What the bot's save request writes (``AliyunCloud.save_runner`` on OSS, ``AwsCloud.save_runner`` on S3)."""
    s3.put_object(Bucket=BUCKET, Key=CONTROL, Body=dump_control(SaveControl(at=datetime.now(UTC))))


async def test_a_save_request_commits_a_fresh_checkpoint_and_training_goes_on_to_the_end(
    tmp_path: Path, s3: Any
) -> None:
    reports = tmp_path / "reports.jsonl"
    aws = s3.meta.endpoint_url
    # No periodic sync: only the save request makes a commit before the end.
    env = runner_env(AWS_ENDPOINT_URL=aws, FINETUNE_SYNC_SECONDS="600")
    spec = write_spec(
        tmp_path / "a1.json",
        checkpoint_uri=URI,
        report=[f"file://{reports}"],
        command=tiny_command("--save-steps", "50", "--step-seconds", "0.25"),  # no periodic save in 20 steps
    )
    runner = await start_runner(spec, tmp_path / "a1", env)
    seen = await wait_for_report(reports, lambda r: r["type"] == "progress" and r["step"] >= 3)
    ask_to_save(s3)
    early = await wait_for_report(reports, lambda r: r["type"] == "checkpoint_saved")
    # Saved on request at a step boundary past the signal (the trainer had no checkpoint at all), committed at once.
    assert early["reason"] == "rebalance" and seen["step"] < early["step"] < 20
    assert f"checkpoint-{early['step']}/MANIFEST.json" in keys(s3)

    assert await asyncio.wait_for(runner.wait(), 180) == 0  # the trainer was never stopped: it finished
    got = read_reports(reports)
    assert [(r["kind"], r["source"]) for r in of_type(got, "notice")] == [("save", "control")]
    assert not of_type(got, "interrupted") and not of_type(got, "warning")  # no stop, no restart
    [completed] = of_type(got, "completed")
    assert completed["step"] == 20
    trained = [json.loads(line)["step"] for line in (tmp_path / "a1" / "progress.jsonl").read_text().splitlines()]
    assert trained == list(range(1, 21))  # one run, every step once
    assert (tmp_path / "a1" / "stop-request.save").read_text() == "1\n"  # one request, honoured once


async def test_a_trainer_that_does_not_honour_save_requests_gets_its_newest_checkpoint_committed(
    tmp_path: Path, s3: Any
) -> None:
    reports = tmp_path / "reports.jsonl"
    env = runner_env(AWS_ENDPOINT_URL=s3.meta.endpoint_url, FINETUNE_SYNC_SECONDS="600")
    command = [sys.executable, "-c", PERIODIC_ONLY]
    spec = write_spec(tmp_path / "a1.json", checkpoint_uri=URI, report=[f"file://{reports}"], command=command)
    runner = await start_runner(spec, tmp_path / "a1", env)
    await wait_for_report(reports, lambda r: r["type"] == "progress" and r["step"] >= 12)
    ask_to_save(s3)
    early = await wait_for_report(reports, lambda r: r["type"] == "checkpoint_saved")
    assert early["reason"] == "rebalance" and early["step"] % 5 == 0 and early["step"] >= 10  # what it had
    assert not (tmp_path / "a1" / "stop-request.save").exists()  # nobody to ask: no request written
    assert await asyncio.wait_for(runner.wait(), 120) == 0

"""The runner end to end: real trainer subprocess, moto S3 in server mode, a local IMDSv2, real signals."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from bot.cloud.local.metadata import LocalMetadataServer
from runner.checkpoints import CheckpointStore
from runner.stop_request import STOP_FILE_NAME
from runner.storage.s3 import S3Store
from tests.runner_harness import (
    child_pids,
    of_type,
    read_reports,
    runner_env,
    same_tensors,
    start_runner,
    tiny_command,
    wait_for_report,
    wait_until,
    write_spec,
)
from tests.s3_proxy import S3FaultProxy

MANIFEST_PATH = re.compile(r"/checkpoint-(\d+)/MANIFEST\.json(?:\?|$)")

BUCKET = "ckpt-bucket"
URI = f"s3://{BUCKET}/jobs/ft-test/"


@pytest.fixture
def s3(aws: str) -> Iterator[Any]:
    client = boto3.client("s3", endpoint_url=aws)
    client.create_bucket(Bucket=BUCKET)
    yield client


@pytest.fixture
async def imds() -> AsyncIterator[LocalMetadataServer]:
    server = await LocalMetadataServer(instance_id="i-0runner").start()
    yield server
    await server.stop()


def keys(s3: Any, prefix: str = "jobs/ft-test/") -> list[str]:
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
    return [item["Key"][len(prefix) :] for page in pages for item in page.get("Contents", [])]


async def test_notice_mid_training_loses_no_step_and_resumes_bitwise_equal(
    tmp_path: Path, aws: str, s3: Any, imds: LocalMetadataServer, reference_adapter: bytes
) -> None:
    reports = tmp_path / "reports.jsonl"
    # No periodic sync: only the rebalance recommendation and the notice make commits here.
    env = runner_env(AWS_ENDPOINT_URL=aws, AWS_EC2_METADATA_SERVICE_ENDPOINT=imds.endpoint, FINETUNE_SYNC_SECONDS="600")
    spec = write_spec(
        tmp_path / "a1.json",
        checkpoint_uri=URI,
        report=[f"file://{reports}"],
        notice="aws",
        command=tiny_command("--step-seconds", "0.25"),
    )
    first = await start_runner(spec, tmp_path / "a1", env)

    seen = await wait_for_report(reports, lambda r: r["type"] == "progress" and r["step"] >= 7)
    imds.recommend_rebalance()
    early = await wait_for_report(reports, lambda r: r["type"] == "checkpoint_saved")
    # A fresh checkpoint, saved on the runner's request at a step boundary past the signal (not the newest of the
    # periodic ones, 5), committed at once; the trainer trains on.
    assert early["reason"] == "rebalance" and early["step"] > seen["step"]
    assert f"checkpoint-{early['step']}/MANIFEST.json" in keys(s3)
    await wait_for_report(reports, lambda r: r["type"] == "progress" and r["step"] >= 11)
    # The trainer frozen (SIGSTOP) from the notice until the runner has asked it to stop: the step it stops at does
    # not depend on how soon a busy machine lets the runner see the notice (it would otherwise train to the end).
    [trainer] = child_pids(first.pid)
    os.kill(trainer, signal.SIGSTOP)
    imds.interrupt(seconds=120)
    await wait_until(lambda: (tmp_path / "a1" / STOP_FILE_NAME).exists())
    os.kill(trainer, signal.SIGCONT)
    assert await asyncio.wait_for(first.wait(), 120) == 75

    attempt1 = read_reports(reports)
    [notice] = [r for r in of_type(attempt1, "notice") if r["kind"] == "spot-interruption"]
    [interrupted] = of_type(attempt1, "interrupted")
    reached = max(r["step"] for r in of_type(attempt1, "progress"))
    assert interrupted["saved_in_time"] is True
    assert interrupted["step"] == reached >= 12  # the step the trainer reached: nothing lost
    assert interrupted["uri"] == f"{URI}checkpoint-{reached}/"
    assert set(interrupted["seconds"]) == {"save", "upload", "total"}
    assert notice["deadline"] is not None
    assert f"checkpoint-{reached}/MANIFEST.json" in keys(s3)
    assert not of_type(attempt1, "completed")

    # The replacement instance: an empty disk, no notice pending, attempt 2, same checkpoint URI.
    imds.interruption = imds.rebalance_at = None
    spec2 = write_spec(tmp_path / "a2.json", checkpoint_uri=URI, report=[f"file://{reports}"], notice="aws", attempt=2)
    second = await start_runner(spec2, tmp_path / "a2", env)
    assert await asyncio.wait_for(second.wait(), 180) == 0
    attempt2 = [r for r in read_reports(reports) if r["attempt"] == 2]
    [started] = of_type(attempt2, "started")
    assert started["resumed_from_step"] == reached and started["skipped"] == []
    assert started["instance_id"] == "i-0runner"
    trained = [json.loads(line)["step"] for line in (tmp_path / "a2" / "progress.jsonl").read_text().splitlines()]
    assert trained[0] == reached + 1 and trained[-1] == 20  # the replacement trained exactly the steps left
    [completed] = of_type(attempt2, "completed")
    assert completed["step"] == 20 and completed["output_uri"] == f"{URI}output/"

    final = s3.get_object(Bucket=BUCKET, Key="jobs/ft-test/output/adapter_model.safetensors")["Body"].read()
    assert same_tensors(final, reference_adapter)
    assert "COMPLETED.json" in keys(s3)


async def test_sigkill_mid_upload_skips_the_partial_checkpoint(tmp_path: Path, s3: Any, proxy: S3FaultProxy) -> None:
    reports = tmp_path / "reports.jsonl"
    env = runner_env(AWS_ENDPOINT_URL=proxy.endpoint)
    # Freeze the commit of the second checkpoint to go up after its files, just before its manifest: then pull the
    # plug. Which steps those are is the runner's (it sends the newest complete one, so on a busy machine it may
    # pass over checkpoint-5 or -10); the first manifest it sends is let through.
    manifests: list[int] = []

    def second_manifest(method: str, path: str) -> bool:
        found = MANIFEST_PATH.search(path)
        if method != "PUT" or found is None:
            return False
        if not manifests or int(found[1]) == manifests[0]:
            manifests[:1] = [int(found[1])]
            return False
        manifests.append(int(found[1]))
        return True

    proxy.hold = second_manifest
    spec = write_spec(
        tmp_path / "a1.json",
        checkpoint_uri=URI,
        report=[f"file://{reports}"],
        command=tiny_command("--step-seconds", "0.2"),
    )
    first = await start_runner(spec, tmp_path / "a1", env)
    await asyncio.wait_for(proxy.held.wait(), 120)
    first.send_signal(signal.SIGKILL)
    await first.wait()
    committed, held = manifests[0], manifests[1]
    assert committed < held

    stored = keys(s3)
    assert f"checkpoint-{committed}/MANIFEST.json" in stored
    assert f"checkpoint-{held}/adapter_model.safetensors" in stored
    assert f"checkpoint-{held}/MANIFEST.json" not in stored

    proxy.hold = None
    spec2 = write_spec(tmp_path / "a2.json", checkpoint_uri=URI, report=[f"file://{reports}"], attempt=2)
    second = await start_runner(spec2, tmp_path / "a2", env)
    assert await asyncio.wait_for(second.wait(), 180) == 0
    [started] = of_type([r for r in read_reports(reports) if r["attempt"] == 2], "started")
    assert started["resumed_from_step"] == committed
    skipped = [(s["step"], s["reason"]) for s in started["skipped"]]
    assert (held, "no manifest: its upload never committed") in skipped
    assert all(step > committed and why == "no manifest: its upload never committed" for step, why in skipped)


async def test_a_flipped_byte_is_caught_and_the_previous_checkpoint_used(
    tmp_path: Path, aws: str, s3: Any, reference_run: Path, reference_adapter: bytes
) -> None:
    # Two real checkpoints of the reference run, committed with the runner's own commit protocol.
    local = reference_run
    store = CheckpointStore(S3Store(URI), "ft-test", 1)
    for step in (5, 10):
        await store.commit(local / f"checkpoint-{step}", step)
    await store.store.close()
    key = "jobs/ft-test/checkpoint-10/optimizer.pt"
    body = bytearray(s3.get_object(Bucket=BUCKET, Key=key)["Body"].read())
    body[len(body) // 2] ^= 0x01
    s3.put_object(Bucket=BUCKET, Key=key, Body=bytes(body))

    reports = tmp_path / "reports.jsonl"
    spec = write_spec(tmp_path / "a2.json", checkpoint_uri=URI, report=[f"file://{reports}"], attempt=2)
    runner = await start_runner(spec, tmp_path / "a2", runner_env(AWS_ENDPOINT_URL=aws))
    assert await asyncio.wait_for(runner.wait(), 180) == 0
    [started] = of_type(read_reports(reports), "started")
    assert started["resumed_from_step"] == 5
    assert [(s["step"], s["reason"]) for s in started["skipped"]] == [(10, "checksum mismatch in optimizer.pt")]
    final = s3.get_object(Bucket=BUCKET, Key="jobs/ft-test/output/adapter_model.safetensors")["Body"].read()
    assert same_tensors(final, reference_adapter)


async def test_training_goes_on_through_metadata_outage_token_expiry_and_s3_errors(
    tmp_path: Path, s3: Any, proxy: S3FaultProxy, imds: LocalMetadataServer
) -> None:
    reports = tmp_path / "reports.jsonl"
    env = runner_env(
        AWS_ENDPOINT_URL=proxy.endpoint, AWS_EC2_METADATA_SERVICE_ENDPOINT=imds.endpoint, AWS_MAX_ATTEMPTS="2"
    )
    spec = write_spec(
        tmp_path / "a1.json",
        checkpoint_uri=URI,
        report=[f"file://{reports}"],
        notice="aws",
        command=tiny_command("--max-steps", "60", "--step-seconds", "0.25"),
    )
    runner = await start_runner(spec, tmp_path / "a1", env)
    await wait_for_report(reports, lambda r: r["type"] == "progress" and r["step"] >= 1)
    imds.down = True
    proxy.fail_writes = True
    await wait_for_report(reports, lambda r: r["type"] == "warning" and r["kind"] == "metadata")
    await wait_for_report(reports, lambda r: r["type"] == "warning" and r["kind"] == "storage")
    stuck_at = max(r["step"] for r in of_type(read_reports(reports), "progress"))
    # Still failing, and training still moves.
    await wait_for_report(reports, lambda r: r["type"] == "progress" and r["step"] >= stuck_at + 5)
    assert runner.returncode is None
    assert not of_type(read_reports(reports), "checkpoint_saved")

    imds.down = False
    imds.expire_tokens()  # the runner's token is now refused: it must fetch a new one by itself
    proxy.fail_writes = False
    await wait_for_report(reports, lambda r: r["type"] == "checkpoint_saved")
    imds.interrupt(seconds=60)
    assert await asyncio.wait_for(runner.wait(), 120) == 75
    got = read_reports(reports)
    assert len([r for r in of_type(got, "warning") if r["kind"] == "metadata"]) == 1  # once, not every second
    assert len([r for r in of_type(got, "warning") if r["kind"] == "storage"]) == 1
    [interrupted] = of_type(got, "interrupted")
    assert interrupted["step"] == max(r["step"] for r in of_type(got, "progress"))
    assert f"checkpoint-{interrupted['step']}/MANIFEST.json" in keys(s3)

"""The notice path keeps its promise under a deadline, against moto behind a fault proxy, the instance taken
(SIGKILL to the runner's process group) exactly at the deadline:

* an upload in flight at the notice that can finish is finished, not abandoned for a save that cannot;
* one still going at the report's cutoff goes on and lands before the machine goes (reported after the report);
* one that cannot finish (or a fresh save that cannot) never half-commits, and the report still leaves;
* writes refused until past the deadline: every store call is cut off in time and the report still leaves;
* a download cut short during restore is retried, not taken for a corrupt checkpoint.

Each checks what the store holds at the deadline, that the ``interrupted`` report had already left, and from
which step the next attempt resumes. The trainer is synthetic (no torch: sizes and timing are the point); the
proxy's link is 4 MiB/s, so a 20 MiB checkpoint takes about 5 s to go up.
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
from runner.checkpoints import CheckpointStore
from runner.storage.s3 import MiB, S3Store
from tests.runner_harness import (
    of_type,
    read_reports,
    runner_env,
    start_runner,
    take_instance,
    wait_for_report,
    wait_until,
    write_spec,
)
from tests.s3_proxy import S3FaultProxy

BUCKET = "deadline-bucket"
URI = f"s3://{BUCKET}/jobs/ft-test/"
LINK = 4 * MiB  # bytes/s through the proxy: a 20 MiB checkpoint is ~5 s of upload


def synthetic(*args: str) -> list[str]:
    return [sys.executable, "-m", "tests.trainers.synthetic", *args]


@pytest.fixture
def s3(aws: str) -> Iterator[Any]:
    client = boto3.client("s3", endpoint_url=aws)
    client.create_bucket(Bucket=BUCKET)
    yield client


@pytest.fixture
async def imds() -> AsyncIterator[LocalMetadataServer]:
    server = await LocalMetadataServer(instance_id="i-0deadline").start()
    yield server
    await server.stop()


def instance_env(proxy: S3FaultProxy, imds: LocalMetadataServer, **extra: str) -> dict[str, str]:
    return runner_env(
        **{
            "AWS_ENDPOINT_URL": proxy.endpoint,
            "AWS_EC2_METADATA_SERVICE_ENDPOINT": imds.endpoint,
            "FINETUNE_S3_PART_MIB": "5",
            "FINETUNE_REPORT_RESERVE_SECONDS": "3",  # the report leaves at least 3 s before the machine goes
            **extra,
        }
    )


def committed_steps(s3: Any) -> list[int]:
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix="jobs/ft-test/")
    keys = [item["Key"] for page in pages for item in page.get("Contents", [])]
    return sorted(int(key.split("/")[2].split("-")[1]) for key in keys if key.endswith("/MANIFEST.json"))


async def next_attempt_resumes_from(tmp_path: Path, env: dict[str, str], command: list[str]) -> int | None:
    """Start attempt 2 on a fresh disk; once its trainer has trained a step past the restore, take it away."""
    reports = tmp_path / "attempt2.jsonl"
    spec = write_spec(
        tmp_path / "a2.json", checkpoint_uri=URI, report=[f"file://{reports}"], command=command, attempt=2
    )
    runner = await start_runner(spec, tmp_path / "a2", env, new_session=True)
    try:
        started = await wait_for_report(reports, lambda r: r["type"] == "started")
        resumed: int | None = started["resumed_from_step"]
        await wait_for_report(reports, lambda r: r["type"] == "progress" and r["step"] > (resumed or 0))
        trained = [json.loads(line)["step"] for line in (tmp_path / "a2" / "progress.jsonl").read_text().splitlines()]
        assert trained[0] == (resumed or 0) + 1  # the trainer really went on from there
        return resumed
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(runner.pid, signal.SIGKILL)
        await runner.wait()


async def start_attempt_one(tmp_path: Path, env: dict[str, str], command: list[str]) -> tuple[Any, Path]:
    reports = tmp_path / "attempt1.jsonl"
    spec = write_spec(
        tmp_path / "a1.json", checkpoint_uri=URI, report=[f"file://{reports}"], notice="aws", command=command
    )
    return await start_runner(spec, tmp_path / "a1", env, new_session=True), reports


# Checkpoints of 20 MiB at steps 25 and 50 only, a step every 0.2 s: checkpoint-25 goes up (and the rate is
# measured), then checkpoint-50 is written and its upload starts, and the notice lands right then.
TWO_SAVES = synthetic("--checkpoint-mib", "20", "--save-at", "25,50", "--step-seconds", "0.2")


async def test_a_notice_during_an_upload_that_can_finish_commits_it_and_asks_for_no_save_that_cannot(
    tmp_path: Path, s3: Any, proxy: S3FaultProxy, imds: LocalMetadataServer
) -> None:
    proxy.upload_rate = LINK
    env = instance_env(proxy, imds)
    runner, reports = await start_attempt_one(tmp_path, env, TWO_SAVES)
    await wait_for_report(reports, lambda r: r["type"] == "checkpoint_saved" and r["step"] == 25)
    await wait_until(lambda: proxy.arrivals("PUT", "checkpoint-50/model.bin") > 0)
    # ~5 s of upload left for checkpoint-50; a fresh save would need ~10 s with it (x1.25 + 2 s of margin):
    # 14 s, less the 3 s reserved for the report, is plenty for the first and not enough for both.
    deadline = imds.interrupt(seconds=14)
    await take_instance(runner, deadline)

    got = read_reports(reports)
    [interrupted] = of_type(got, "interrupted")  # it had left before the machine went
    assert interrupted["step"] == 50 and interrupted["uri"] == f"{URI}checkpoint-50/"
    assert interrupted["fresh_save"] == "not-asked" and interrupted["saved_in_time"] is False
    assert "needs" in interrupted["note"] and "committed checkpoint-50" in interrupted["note"]
    late = interrupted["late"]
    assert (late["cause"], late["why"]) == ("not-asked", "too-slow")
    assert late["need_seconds"] > 0 and late["left_seconds"] is not None
    assert 50 in committed_steps(s3)
    assert [r["step"] for r in of_type(got, "checkpoint_saved")] == [25, 50]
    # The upload in flight at the notice was finished, not aborted and started over.
    assert proxy.arrivals("POST", "checkpoint-50/model.bin?uploads") == 1
    assert proxy.arrivals("DELETE", "checkpoint-50/model.bin") == 0

    proxy.upload_rate = None
    assert await next_attempt_resumes_from(tmp_path, env, TWO_SAVES) == 50


async def test_a_commit_still_going_at_the_cutoff_lands_after_the_report_and_before_the_machine_goes(
    tmp_path: Path, s3: Any, proxy: S3FaultProxy, imds: LocalMetadataServer
) -> None:
    # checkpoint-50's 20 MiB need ~5 s; the report must leave 2 s after the notice (8 s reserved of 10), and the
    # machine goes at 10 s: the commit is not given up at the cutoff, it lands before the machine goes.
    proxy.upload_rate = LINK
    env = instance_env(proxy, imds, FINETUNE_REPORT_RESERVE_SECONDS="8")
    runner, reports = await start_attempt_one(tmp_path, env, TWO_SAVES)
    await wait_for_report(reports, lambda r: r["type"] == "checkpoint_saved" and r["step"] == 25)
    await wait_until(lambda: proxy.arrivals("PUT", "checkpoint-50/model.bin") > 0)
    deadline = imds.interrupt(seconds=10)
    await take_instance(runner, deadline)

    got = read_reports(reports)
    [interrupted] = of_type(got, "interrupted")
    assert interrupted["step"] == 25 and interrupted["committing"] == [50]
    assert "still committing checkpoint-50" in interrupted["note"]
    assert committed_steps(s3) == [25, 50]  # the manifest was written before the deadline
    late = got[got.index(interrupted) + 1 :]
    assert [(r["step"], r["reason"]) for r in of_type(late, "checkpoint_saved")] == [(50, "notice")]
    proxy.upload_rate = None
    assert await next_attempt_resumes_from(tmp_path, env, TWO_SAVES) == 50


@pytest.mark.parametrize("what", ["upload in flight", "fresh save"])
async def test_a_notice_with_too_little_time_still_reports_and_commits_nothing_half_done(
    tmp_path: Path, s3: Any, proxy: S3FaultProxy, imds: LocalMetadataServer, what: str
) -> None:
    proxy.upload_rate = LINK
    if what == "upload in flight":
        # checkpoint-50's 20 MiB go up at 1 MiB/s once the notice is there: ~20 s; the machine goes after 6 s.
        env = instance_env(proxy, imds)
        command = TWO_SAVES
        runner, reports = await start_attempt_one(tmp_path, env, command)
        await wait_for_report(reports, lambda r: r["type"] == "checkpoint_saved" and r["step"] == 25)
        await wait_until(lambda: proxy.arrivals("PUT", "checkpoint-50/model.bin") > 0)
    else:
        # Nothing uploaded before (no periodic sync): the runner has no rate to judge by and nothing to protect,
        # so it asks for the save, which cannot go up in time (the 1 GB-at-8-s finding, scaled down).
        env = instance_env(proxy, imds, FINETUNE_SYNC_SECONDS="600")
        command = synthetic("--checkpoint-mib", "20", "--save-every", "100000", "--step-seconds", "0.2")
        runner, reports = await start_attempt_one(tmp_path, env, command)
        await wait_for_report(reports, lambda r: r["type"] == "progress" and r["step"] >= 3)
    proxy.upload_rate = MiB
    deadline = imds.interrupt(seconds=6)
    await take_instance(runner, deadline)

    got = read_reports(reports)
    [interrupted] = of_type(got, "interrupted")
    assert interrupted["saved_in_time"] is False
    assert interrupted["reached_step"] > (interrupted["step"] or 0)
    if what == "upload in flight":
        assert interrupted["step"] == 25 and committed_steps(s3) == [25]
        assert interrupted["committing"] == [50]
        expected_resume: int | None = 25
    else:
        assert interrupted["step"] is None and committed_steps(s3) == []
        assert interrupted["fresh_save"] == "not-uploaded"
        assert interrupted["committing"] == [interrupted["reached_step"]]  # the fresh save, still going up
        expected_resume = None
    proxy.upload_rate = None
    assert await next_attempt_resumes_from(tmp_path, env, command) == expected_resume


async def test_writes_refused_until_past_the_deadline_still_let_the_report_leave_in_time(
    tmp_path: Path, s3: Any, proxy: S3FaultProxy, imds: LocalMetadataServer
) -> None:
    env = instance_env(proxy, imds)
    command = synthetic("--checkpoint-mib", "4", "--save-at", "10", "--step-seconds", "0.2")
    runner, reports = await start_attempt_one(tmp_path, env, command)
    await wait_for_report(reports, lambda r: r["type"] == "checkpoint_saved" and r["step"] == 10)
    proxy.fail_writes = True  # every PUT/POST answered 503 SlowDown, from now until the machine is gone
    deadline = imds.interrupt(seconds=10)
    await take_instance(runner, deadline)

    got = read_reports(reports)
    [interrupted] = of_type(got, "interrupted")
    assert interrupted["fresh_save"] == "not-uploaded"  # the trainer saved; nothing could be written
    assert interrupted["step"] == 10 and committed_steps(s3) == [10]
    assert interrupted["note"].startswith("upload failed before the deadline") and "503" in interrupted["note"]
    assert interrupted["late"]["cause"] == "upload-failed" and "503" in interrupted["late"]["error"]
    assert any(status == 503 for _, _, status in proxy.seen)
    proxy.fail_writes = False
    assert await next_attempt_resumes_from(tmp_path, env, command) == 10


async def test_a_download_cut_short_on_restore_is_retried_not_taken_for_corruption(
    tmp_path: Path, aws: str, s3: Any, proxy: S3FaultProxy
) -> None:
    store = CheckpointStore(S3Store(URI, part_size=5 * MiB, multipart_threshold=5 * MiB), "ft-test", 1)
    for step in (10, 20):
        local = tmp_path / "local" / f"checkpoint-{step}"
        local.mkdir(parents=True)
        (local / "model.bin").write_bytes(os.urandom(12 * MiB))
        (local / "trainer_state.json").write_text(json.dumps({"global_step": step}))
        await store.commit(local, step)
    await store.store.close()
    # The first two GETs of the newest checkpoint's weights are cut off half-way, like a connection reset.
    proxy.truncate = lambda path: "checkpoint-20/model.bin" in path
    proxy.truncate_times = 2
    env = runner_env(AWS_ENDPOINT_URL=proxy.endpoint, FINETUNE_S3_PART_MIB="5")
    command = synthetic("--checkpoint-mib", "1", "--save-every", "1000", "--step-seconds", "0.05")
    assert await next_attempt_resumes_from(tmp_path, env, command) == 20
    assert len(proxy.truncated) == 2
    [started] = of_type(read_reports(tmp_path / "attempt2.jsonl"), "started")
    assert started["skipped"] == []

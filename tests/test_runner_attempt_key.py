"""The real runner on AWS (moto, a local IMDSv2) takes its report key from its own instance's key object, or none.

The spec names only where keys lie (``report_key_from``); the runner appends the instance id its metadata service
gives. A key object that is not there within the storage patience, or that is another attempt's, leaves the runner
unable to sign anything: it says so on stderr, starts no trainer, sends no report and exits 3
(``EXIT_NO_REPORT_KEY``). The whole AWS story with keys read this way is tests/test_aws_scenario.py.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import boto3
import pytest

from bot.cloud.local.metadata import LocalMetadataServer
from handlers.attempt_keys import StorageCredentials, dump_attempt_key
from runner.exit_codes import EXIT_NO_REPORT_KEY
from tests.runner_harness import read_reports, runner_env, start_runner, wait_until
from tests.s3_proxy import S3FaultProxy
from tests.servers import AWS_TEST_ENV

BUCKET = "ft-keys"
ROLE_ID = "AROAEXAMPLERUNNERROLE"
INSTANCE = "i-0a1b2c3d4e5f60718"
KEY = "ab" * 32


@pytest.fixture
async def imds() -> AsyncIterator[LocalMetadataServer]:
    server = await LocalMetadataServer(instance_id=INSTANCE).start()
    yield server
    await server.stop()


def spec_file(tmp_path: Path, job_id: str = "ft-keys1", attempt: int = 1) -> Path:
    """The spec as the bot writes it on AWS (no key in it); a local copy for ``--spec``, the reports to a file."""
    spec = {
        "version": 1,
        "job_id": job_id,
        "attempt": attempt,
        "command": [sys.executable, "-m", "tests.trainers.synthetic", "--max-steps", "2", "--step-seconds", "0.01"],
        "checkpoint_uri": f"s3://{BUCKET}/jobs/{job_id}/",
        "report": [f"file://{tmp_path / 'reports.jsonl'}"],
        "notice": "aws",
        "report_key_from": f"s3://{BUCKET}/attempt-keys/{ROLE_ID}:",
    }
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    return path


def key_object(job_id: str = "ft-keys1", attempt: int = 1) -> dict[str, object]:
    return {
        "Bucket": BUCKET,
        "Key": f"attempt-keys/{ROLE_ID}:{INSTANCE}",
        "Body": dump_attempt_key(job_id, attempt, KEY),
    }


async def run_runner(spec: Path, tmp_path: Path, imds: LocalMetadataServer, patience: str) -> tuple[int, str]:
    env = runner_env(AWS_EC2_METADATA_SERVICE_ENDPOINT=imds.endpoint, FINETUNE_STORAGE_PATIENCE_SECONDS=patience)
    env.pop("FINETUNE_REPORT_SECRET", None)  # an AWS instance has no other key
    process = await start_runner(spec, tmp_path / "work", env)
    code = await asyncio.wait_for(process.wait(), 120)
    return code, (tmp_path / "work-runner.log").read_text()


async def test_a_runner_whose_instance_has_no_key_object_reports_nothing_and_says_so(
    tmp_path: Path, aws: str, imds: LocalMetadataServer
) -> None:
    s3 = boto3.client("s3", endpoint_url=aws)
    s3.create_bucket(Bucket=BUCKET)
    s3.put_object(**{**key_object(), "Key": f"attempt-keys/{ROLE_ID}:i-0ffffffffffffffff"})  # another instance's
    code, log = await run_runner(spec_file(tmp_path), tmp_path, imds, patience="1")
    assert code == EXIT_NO_REPORT_KEY
    assert f"no report key at s3://{BUCKET}/attempt-keys/{ROLE_ID}:{INSTANCE} within 1 s" in log
    assert "cannot report, so it starts nothing" in log and KEY not in log
    assert read_reports(tmp_path / "reports.jsonl") == []  # not even a failed: it could not be signed
    assert not (tmp_path / "work" / "output").exists()  # no trainer ran


async def test_a_key_object_of_another_attempt_is_not_used(
    tmp_path: Path, aws: str, imds: LocalMetadataServer
) -> None:
    s3 = boto3.client("s3", endpoint_url=aws)
    s3.create_bucket(Bucket=BUCKET)
    s3.put_object(**key_object(attempt=2))  # this instance's name, but the key of attempt 2
    code, log = await run_runner(spec_file(tmp_path), tmp_path, imds, patience="30")
    assert code == EXIT_NO_REPORT_KEY
    assert "holds the key of ft-keys1 attempt 2, not ft-keys1 attempt 1" in log and KEY not in log
    assert read_reports(tmp_path / "reports.jsonl") == []


async def test_a_key_object_written_after_the_runner_began_waiting_is_used(
    tmp_path: Path, aws: str, imds: LocalMetadataServer
) -> None:
    s3 = boto3.client("s3", endpoint_url=aws)
    s3.create_bucket(Bucket=BUCKET)
    spec = spec_file(tmp_path)
    env = runner_env(AWS_EC2_METADATA_SERVICE_ENDPOINT=imds.endpoint, FINETUNE_STORAGE_PATIENCE_SECONDS="60")
    env.pop("FINETUNE_REPORT_SECRET", None)
    process = await start_runner(spec, tmp_path / "work", env)
    await wait_until(lambda: imds.requests > 0)  # it has asked which instance it is: the key is not there yet
    s3.put_object(**key_object())
    assert await asyncio.wait_for(process.wait(), 120) == 0
    log = (tmp_path / "work-runner.log").read_text()
    assert f"report key of ft-keys1 attempt 1 read from s3://{BUCKET}/attempt-keys/{ROLE_ID}:{INSTANCE}" in log
    assert [report["type"] for report in read_reports(tmp_path / "reports.jsonl")][-1] == "completed"


async def test_with_a_storage_session_the_runner_reads_its_key_object_first_and_signs_every_job_request_with_it(
    tmp_path: Path, aws: str, imds: LocalMetadataServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stack with a runner storage role: the instance profile may read its key object and no job object, so the
    user data names where keys lie (FINETUNE_KEY_FROM), and the spec, restore, checkpoints and completion record all
    go with the attempt's own session; only the key object is read with the instance's credentials."""
    proxy = await S3FaultProxy(aws).start()
    try:
        s3 = boto3.client("s3", endpoint_url=aws)
        s3.create_bucket(Bucket=BUCKET)
        spec = json.loads(spec_file(tmp_path).read_text())
        s3.put_object(Bucket=BUCKET, Key="jobs/ft-keys1/spec-attempt-1.json", Body=json.dumps(spec).encode())
        session = StorageCredentials(
            access_key_id="ASIAATTEMPTSESSION01",
            secret_access_key="the-sessions-secret-0123456789",
            session_token="the-sessions-token-0123456789",
            expiration=datetime.now(UTC) + timedelta(hours=1),
        )
        s3.put_object(**{**key_object(), "Body": dump_attempt_key("ft-keys1", 1, KEY, session)})
        env = runner_env(
            AWS_ENDPOINT_URL=proxy.endpoint,
            AWS_EC2_METADATA_SERVICE_ENDPOINT=imds.endpoint,
            FINETUNE_KEY_FROM=f"s3://{BUCKET}/attempt-keys/{ROLE_ID}:",
        )
        env.pop("FINETUNE_REPORT_SECRET", None)
        work = tmp_path / "work"
        work.mkdir()
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "runner.cli",
            "run",
            "--spec",
            f"s3://{BUCKET}/jobs/ft-keys1/spec-attempt-1.json",
            "--work-dir",
            str(work),
            env=env,
            stdout=(tmp_path / "runner.log").open("wb"),
            stderr=asyncio.subprocess.STDOUT,
        )
        assert await asyncio.wait_for(process.wait(), 120) == 0, (tmp_path / "runner.log").read_text()
    finally:
        await proxy.stop()
    assert [report["type"] for report in read_reports(tmp_path / "reports.jsonl")][-1] == "completed"
    assert set(proxy.signers("/attempt-keys/")) == {AWS_TEST_ENV["AWS_ACCESS_KEY_ID"]}
    job_requests = proxy.signers("/jobs/ft-keys1/")
    assert len(job_requests) > 3 and set(job_requests) == {session.access_key_id}  # the spec, restore, uploads
    assert s3.get_object(Bucket=BUCKET, Key="jobs/ft-keys1/COMPLETED.json")["Body"].read()
    log = (tmp_path / "runner.log").read_text()
    assert "storage: the attempt's own session" in log and session.secret_access_key not in log


async def test_a_session_nobody_renews_is_said_loudly_once_while_it_still_works(
    tmp_path: Path, aws: str, imds: LocalMetadataServer
) -> None:
    """The bot is down: the session in the key object ends within ten minutes and nothing newer comes. The runner
    logs it, reports it once (kind ``storage-credentials``) and keeps storing while the session lasts."""
    s3 = boto3.client("s3", endpoint_url=aws)
    s3.create_bucket(Bucket=BUCKET)
    ending = StorageCredentials(
        access_key_id="ASIAENDINGSESSION001",
        secret_access_key="the-sessions-secret-0123456789",
        session_token="the-sessions-token-0123456789",
        expiration=datetime.now(UTC) + timedelta(minutes=9),
    )
    s3.put_object(**{**key_object(), "Body": dump_attempt_key("ft-keys1", 1, KEY, ending)})
    spec = spec_file(tmp_path)
    raw = json.loads(spec.read_text())
    raw["command"] = [*raw["command"][:3], "--max-steps", "30", "--step-seconds", "0.05", "--save-every", "10"]
    spec.write_text(json.dumps(raw))
    env = runner_env(AWS_EC2_METADATA_SERVICE_ENDPOINT=imds.endpoint, FINETUNE_CREDENTIALS_CHECK_SECONDS="0.1")
    env.pop("FINETUNE_REPORT_SECRET", None)
    process = await start_runner(spec, tmp_path / "work", env)
    assert await asyncio.wait_for(process.wait(), 120) == 0
    reports = read_reports(tmp_path / "reports.jsonl")
    warned = [r for r in reports if r["type"] == "warning" and r["kind"] == "storage-credentials"]
    assert len(warned) == 1 and "the bot has not renewed them" in warned[0]["message"]
    assert reports[-1]["type"] == "completed"
    assert "STORAGE CREDENTIALS NOT RENEWED" in (tmp_path / "work-runner.log").read_text()

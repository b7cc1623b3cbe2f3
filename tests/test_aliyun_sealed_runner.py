"""The runner's side of Alibaba's per-attempt OSS tokens: it reads its sealed key object with its instance RAM role
(from the local metadata service, hardened mode), opens it with the report key of its user data, and signs every
job request with the token inside, reading the object again when the bot has renewed it.

The bot (AliyunCloud against the OpenAPI double) writes the object to moto; the runner reaches moto through a
forwarding proxy that shows which access key signed each request.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from bot.cloud.aliyun.provider import AliyunCloud
from bot.cloud.base import Instance
from bot.cloud.local.metadata import LocalMetadataServer
from handlers.attempt_keys import StorageCredentials, seal
from handlers.report_keys import ReportKeys
from runner.reports.key_object import NoReportKey, fetch_sealed_key, own_key, storage_credentials
from runner.storage.attempt_credentials import ADVISORY_SECONDS
from runner.storage.open import open_store
from tests.aliyun_fakes import FakeAliyun
from tests.runner_harness import read_reports, runner_env
from tests.s3_proxy import S3FaultProxy
from tests.test_aliyun_cloud import BUCKET, GPU, MASTER, SALT, job_spec
from tests.test_aliyun_cloud import bucket as bucket
from tests.test_aliyun_cloud import fake as fake
from tests.test_aliyun_cloud import make_cloud as make_cloud
from tests.test_aliyun_storage_tokens import REPORT_URL, STORAGE_ROLE

ROLE = "finetune-runner"
ROLE_KEY = "STS.instancerole0001"
KEY_FROM = f"oss://{BUCKET}/attempt-keys/"


@pytest.fixture
async def metadata() -> AsyncIterator[LocalMetadataServer]:
    server = await LocalMetadataServer(dialect="aliyun").start()
    expiry = (datetime.now(UTC) + timedelta(hours=6)).strftime("%Y-%m-%dT%H:%M:%SZ")
    server.ram_roles[ROLE] = {
        "AccessKeyId": ROLE_KEY,
        "AccessKeySecret": "secret-of-the-instance-role",
        "SecurityToken": "token-of-the-instance-role",
        "Expiration": expiry,
        "Code": "Success",
    }
    yield server
    await server.stop()


@pytest.fixture
async def proxy(aws: str, bucket: Any) -> AsyncIterator[S3FaultProxy]:
    started = await S3FaultProxy(aws).start()
    yield started
    await started.stop()


@pytest.fixture
def on_the_instance(
    monkeypatch: pytest.MonkeyPatch, proxy: S3FaultProxy, metadata: LocalMetadataServer
) -> LocalMetadataServer:
    """The runner's environment as the boot script writes it (but path-style OSS on the proxy, no key pair)."""
    for name in ("ALIBABA_CLOUD_ACCESS_KEY_ID", "ALIBABA_CLOUD_ACCESS_KEY_SECRET", "AWS_ACCESS_KEY_ID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OSS_ENDPOINT", proxy.endpoint)
    monkeypatch.setenv("OSS_REGION", "cn-hangzhou")
    monkeypatch.setenv("FINETUNE_S3_ADDRESSING", "path")
    monkeypatch.setenv("ALIBABA_CLOUD_ECS_METADATA", ROLE)
    monkeypatch.setenv("ALIBABA_CLOUD_METADATA_ENDPOINT", metadata.endpoint)
    return metadata


async def launched(
    fake: FakeAliyun, make_cloud: Callable[..., AliyunCloud], job_id: str
) -> tuple[AliyunCloud, Instance]:
    fake.roles.add(STORAGE_ROLE)
    cloud = make_cloud(runner_storage_role_arn=STORAGE_ROLE, report_url=REPORT_URL, sts_endpoint=fake.endpoint)
    return cloud, await cloud.launch(job_spec(cloud, job_id, 1), [GPU], "spot")


async def test_the_runner_opens_its_token_and_signs_job_requests_with_it(
    fake: FakeAliyun,
    make_cloud: Callable[..., AliyunCloud],
    proxy: S3FaultProxy,
    on_the_instance: LocalMetadataServer,
) -> None:
    cloud, instance = await launched(fake, make_cloud, "ft-aaa1")
    on_the_instance.instance_id = instance.instance_id
    report_key = ReportKeys(MASTER).of("ft-aaa1", 1, SALT)

    fetched = await fetch_sealed_key(KEY_FROM, report_key, patience=5, poll=0.05)
    (token,) = fake.assumed
    assert fetched.uri == KEY_FROM + instance.instance_id
    assert fetched.found.storage is not None and fetched.found.storage.access_key_id == token.access_key_id
    assert own_key(job_spec(cloud, "ft-aaa1", 1), fetched) == report_key
    assert set(proxy.signers("attempt-keys/")) == {ROLE_KEY}  # the key object: with the instance role

    credentials = storage_credentials(fetched)
    assert credentials is not None
    store = open_store(cloud.checkpoint_uri("ft-aaa1"), credentials)
    try:
        assert b'"job_id":"ft-aaa1"' in (await store.get_bytes("spec-attempt-1.json") or b"")
        await store.put_bytes("checkpoint-1/weights.bin", b"w")
    finally:
        await store.close()
        await credentials.close()
    assert set(proxy.signers("/jobs/ft-aaa1/")) == {token.access_key_id}  # every job request: the attempt's token
    assert any(security == token.security_token for _, security in proxy.credentials)


async def test_another_attempts_key_or_instance_gets_no_token(
    fake: FakeAliyun,
    make_cloud: Callable[..., AliyunCloud],
    on_the_instance: LocalMetadataServer,
) -> None:
    _, instance = await launched(fake, make_cloud, "ft-aaa1")
    on_the_instance.instance_id = instance.instance_id
    with pytest.raises(NoReportKey, match="does not open with this attempt's report key"):
        await fetch_sealed_key(KEY_FROM, ReportKeys(MASTER).of("ft-bbb1", 1, SALT), patience=5, poll=0.05)
    on_the_instance.instance_id = "i-bpother000000000"  # an instance whose object the bot never wrote
    with pytest.raises(NoReportKey, match=r"no report key at .*i-bpother000000000 within"):
        await fetch_sealed_key(KEY_FROM, ReportKeys(MASTER).of("ft-aaa1", 1, SALT), patience=0.2, poll=0.05)


class Clock:
    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


async def test_a_renewed_token_is_read_and_opened_again(
    fake: FakeAliyun,
    make_cloud: Callable[..., AliyunCloud],
    on_the_instance: LocalMetadataServer,
) -> None:
    cloud, instance = await launched(fake, make_cloud, "ft-aaa1")
    on_the_instance.instance_id = instance.instance_id
    fetched = await fetch_sealed_key(KEY_FROM, ReportKeys(MASTER).of("ft-aaa1", 1, SALT), patience=5, poll=0.05)
    first = fetched.found.storage
    assert first is not None
    clock = Clock(first.expiration - timedelta(seconds=ADVISORY_SECONDS + 60))
    credentials = storage_credentials(fetched, clock=clock)
    assert credentials is not None
    try:
        fake.now = lambda: datetime.now(UTC) + timedelta(minutes=5)  # a later token ends later
        await cloud.renew_storage_credentials("ft-aaa1", 1, instance.instance_id, key_salt=SALT)
        assert await credentials.renew_if_due()  # not due yet: the object is not read
        assert credentials.renewals == 0
        clock.now += timedelta(minutes=2)  # inside the advisory window now
        assert await credentials.renew_if_due()
        assert credentials.renewals == 1 and credentials.current.access_key_id == fake.assumed[1].access_key_id
    finally:
        await credentials.close()


async def test_the_real_runner_opens_its_token_first_and_signs_every_job_request_with_it(
    tmp_path: Path, aws: str, bucket: Any, proxy: S3FaultProxy, metadata: LocalMetadataServer
) -> None:
    """``finetune-runner run`` as the boot script starts it: FINETUNE_KEY_FROM and the report key in the environment,
    the instance role for the key object only; the spec, checkpoints and completion record go with the token."""
    instance_id = "i-bpsealed00000001"
    metadata.instance_id = instance_id
    report_key = ReportKeys(MASTER).of("ft-seal1", 1, SALT)
    spec = {
        "version": 1,
        "job_id": "ft-seal1",
        "attempt": 1,
        "command": [sys.executable, "-m", "tests.trainers.synthetic", "--max-steps", "2", "--step-seconds", "0.01"],
        "checkpoint_uri": f"oss://{BUCKET}/jobs/ft-seal1/",
        "report": [f"file://{tmp_path / 'reports.jsonl'}"],
        "notice": "aliyun",
    }
    bucket.put_object(Bucket=BUCKET, Key="jobs/ft-seal1/spec-attempt-1.json", Body=json.dumps(spec).encode())
    token = StorageCredentials(
        access_key_id="STS.AttemptToken0000001",
        secret_access_key="the-tokens-secret-0123456789",
        session_token="the-tokens-security-token-0123456789",
        expiration=datetime.now(UTC) + timedelta(hours=1),
    )
    body = seal(report_key, instance_id, "ft-seal1", 1, token)
    bucket.put_object(Bucket=BUCKET, Key=f"attempt-keys/{instance_id}", Body=body)
    env = runner_env(
        OSS_ENDPOINT=proxy.endpoint,
        OSS_REGION="cn-hangzhou",
        FINETUNE_S3_ADDRESSING="path",
        ALIBABA_CLOUD_ECS_METADATA=ROLE,
        ALIBABA_CLOUD_METADATA_ENDPOINT=metadata.endpoint,
        FINETUNE_KEY_FROM=KEY_FROM,
        FINETUNE_REPORT_SECRET=report_key,
    )
    for name in ("ALIBABA_CLOUD_ACCESS_KEY_ID", "ALIBABA_CLOUD_ACCESS_KEY_SECRET"):
        env.pop(name, None)
    work = tmp_path / "work"
    work.mkdir()
    log = tmp_path / "runner.log"
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "runner.cli",
        "run",
        "--spec",
        f"oss://{BUCKET}/jobs/ft-seal1/spec-attempt-1.json",
        "--work-dir",
        str(work),
        env=env,
        stdout=log.open("wb"),
        stderr=asyncio.subprocess.STDOUT,
    )
    assert await asyncio.wait_for(process.wait(), 120) == 0, log.read_text()[-3000:]
    assert [report["type"] for report in read_reports(tmp_path / "reports.jsonl")][-1] == "completed"
    assert set(proxy.signers("/attempt-keys/")) == {ROLE_KEY}
    job_requests = proxy.signers("/jobs/ft-seal1/")
    assert len(job_requests) > 3 and set(job_requests) == {token.access_key_id}  # the spec, restore, uploads
    assert bucket.get_object(Bucket=BUCKET, Key="jobs/ft-seal1/COMPLETED.json")["Body"].read()
    text = log.read_text()
    assert "storage: the attempt's own session" in text and token.secret_access_key not in text

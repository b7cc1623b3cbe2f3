"""oss:// on an ECS instance without a key pair: the runner's S3-API store signs with the STS credentials of the
instance's RAM role, read from (the local stand-in for) the ECS metadata service, and renews them when they run out.
moto is the bucket; a forwarding proxy in front of it shows which credentials each request was signed with."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import boto3
import pytest

from bot.cloud.local.metadata import LocalMetadataServer
from runner.storage.base import StorageError
from runner.storage.s3 import S3Store, client_settings
from tests.s3_proxy import S3FaultProxy
from tests.servers import AWS_TEST_ENV

ROLE = "finetune-runner"
BUCKET = "ft-oss-role"


def credentials(key: str, token: str, valid_for: timedelta) -> dict[str, str]:
    expiry = (datetime.now(UTC) + valid_for).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "AccessKeyId": key,
        "AccessKeySecret": f"secret-of-{key}",
        "SecurityToken": token,
        "Expiration": expiry,
        "LastUpdated": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "Code": "Success",
    }


@pytest.fixture
async def metadata() -> AsyncIterator[LocalMetadataServer]:
    server = await LocalMetadataServer(dialect="aliyun", instance_id="i-bp1role000000000").start()
    yield server
    await server.stop()


@pytest.fixture
async def proxy(aws: str) -> AsyncIterator[S3FaultProxy]:
    boto3.client("s3", endpoint_url=aws).create_bucket(Bucket=BUCKET)
    started = await S3FaultProxy(aws).start()
    yield started
    await started.stop()


def role_store(proxy: S3FaultProxy, metadata: LocalMetadataServer, role: str = ROLE) -> S3Store:
    env = {
        "OSS_ENDPOINT": proxy.endpoint,
        "OSS_REGION": "cn-hangzhou",
        "FINETUNE_S3_ADDRESSING": "path",
        "ALIBABA_CLOUD_ECS_METADATA": role,
        "ALIBABA_CLOUD_METADATA_ENDPOINT": metadata.endpoint,
    }
    return S3Store(f"oss://{BUCKET}/jobs/ft-abc1/", env=env)


async def test_the_store_signs_with_the_roles_sts_credentials(
    proxy: S3FaultProxy, metadata: LocalMetadataServer
) -> None:
    metadata.ram_roles[ROLE] = credentials("STS.first", "token-one", timedelta(hours=1))
    store = role_store(proxy, metadata)
    try:
        await store.put_bytes("control/attempt-1.json", b'{"type": "stop"}')
        assert await store.get_bytes("control/attempt-1.json") == b'{"type": "stop"}'
    finally:
        await store.close()
    assert proxy.credentials
    for authorization, token in proxy.credentials:
        assert "Credential=STS.first/" in authorization
        assert token == "token-one"
    assert metadata.credential_requests == 1  # valid for an hour: read once


async def test_credentials_about_to_expire_are_read_again(proxy: S3FaultProxy, metadata: LocalMetadataServer) -> None:
    metadata.ram_roles[ROLE] = credentials("STS.old", "token-old", timedelta(minutes=2))
    store = role_store(proxy, metadata)
    try:
        await store.put_bytes("a", b"1")  # loads the old ones, which are inside botocore's refresh window already
        metadata.ram_roles[ROLE] = credentials("STS.new", "token-new", timedelta(hours=1))
        await store.put_bytes("b", b"2")
    finally:
        await store.close()
    assert proxy.credentials[-1][1] == "token-new"
    assert "Credential=STS.new/" in proxy.credentials[-1][0]
    assert metadata.credential_requests >= 2


async def test_a_missing_role_is_a_clear_storage_error(proxy: S3FaultProxy, metadata: LocalMetadataServer) -> None:
    store = role_store(proxy, metadata, role="no-such-role")
    try:
        with pytest.raises(StorageError, match="no RAM role 'no-such-role'"):
            await store.put_bytes("a", b"1")
    finally:
        await store.close()
    assert proxy.credentials == []  # nothing was sent unsigned


def test_a_key_pair_wins_over_the_role() -> None:
    env = {"OSS_ENDPOINT": "https://oss-cn-hangzhou-internal.aliyuncs.com", "ALIBABA_CLOUD_ECS_METADATA": ROLE}
    assert client_settings("oss", env).ram_role == ROLE
    assert client_settings("oss", env).metadata_endpoint == "http://100.100.100.200"
    keyed = {**env, "ALIBABA_CLOUD_ACCESS_KEY_ID": "LTAI", "ALIBABA_CLOUD_ACCESS_KEY_SECRET": "s"}
    assert client_settings("oss", keyed).ram_role is None
    assert client_settings("s3", env).ram_role is None  # only oss:// reads Alibaba's variables


def test_the_bots_provider_as_deployed_writes_oss_with_the_roles_renewed_sts_key_read_the_hardened_way(
    tmp_path: Path,
) -> None:
    """The bot on its ECS instance: no key pair, the SDK's chain reads its RAM role from the metadata service at the
    address the SDK knows (in a network namespace of its own: tests/aliyun_role_probe.py), with a session token on
    every read, and renews the STS key before it runs out; the specs go to OSS signed with it."""
    why = None if os.geteuid() == 0 else "needs root"
    why = why or next((f"needs {tool}" for tool in ("unshare", "ip") if shutil.which(tool) is None), None)
    if why is None and subprocess.run(["unshare", "--net", "true"], check=False).returncode != 0:
        why = "no network namespaces here"
    if why:
        pytest.skip(f"the metadata service at 100.100.100.200 is stood in for in a network namespace: {why}")
    env = {
        **os.environ,
        **AWS_TEST_ENV,
        "PYTHONPATH": str(Path(__file__).resolve().parent.parent),
        "ALIBABA_CLOUD_ECS_METADATA": "finetune-bot",  # what the bot stack's boot script writes
        "ALIBABA_CLOUD_IMDSV1_DISABLED": "true",
    }
    for name in ("ALIBABA_CLOUD_ACCESS_KEY_ID", "ALIBABA_CLOUD_ACCESS_KEY_SECRET"):
        env.pop(name, None)  # no key pair: the role's
    env.pop("ALIBABA_CLOUD_ECS_METADATA_DISABLED", None)
    ran = subprocess.run(
        ["unshare", "--net", "--", sys.executable, "-m", "tests.aliyun_role_probe", str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    seen = json.loads(ran.stdout)
    assert seen["launched"] == 2 and seen["ecs_rejected"] == []  # ECS took the role's key
    first, tokens = seen["first_launch_requests"], seen["oss_tokens"]
    assert first and set(tokens[:first]) == {"sts-first"} and set(tokens[first:]) == {"sts-second"}
    assert seen["refused_without_token"] == 0 and seen["token_requests"] >= 1
    assert seen["credential_requests"] >= 2  # read again once the first key was near its end

"""Run inside a network namespace of its own (``unshare --net``): the bot's Alibaba provider as deployed, with no key
pair, on an "ECS instance" whose metadata service answers at the real address (``100.100.100.200:80`` on this
namespace's loopback: Alibaba's credential SDK knows no other) in the hardened mode. Two launches, the role's STS key
renewed in between; prints one JSON object of what OSS and the metadata service saw.

    ALIBABA_CLOUD_ECS_METADATA=finetune-bot ALIBABA_CLOUD_IMDSV1_DISABLED=true python -m tests.aliyun_role_probe DIR
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import boto3

from bot.cloud.aliyun.provider import AliyunCloud
from bot.cloud.local.metadata import LocalMetadataServer
from tests.aliyun_fakes import ACCESS_KEY_ID, ACCESS_KEY_SECRET, FakeAliyun
from tests.s3_proxy import S3FaultProxy
from tests.servers import AWS_TEST_ENV, moto_server
from tests.test_aliyun_cloud import BUCKET, GPU, REGION, VSWITCHES, job_spec, settings

ROLE = "finetune-bot"
METADATA_ADDRESS = "100.100.100.200"


def role_credentials(token: str, valid_for: timedelta) -> dict[str, str]:
    """The role's STS document (the ECS double knows one key pair; the token tells the two sessions apart)."""
    now = datetime.now(UTC)
    return {
        "AccessKeyId": ACCESS_KEY_ID,
        "AccessKeySecret": ACCESS_KEY_SECRET,
        "SecurityToken": token,
        "Expiration": (now + valid_for).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "LastUpdated": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "Code": "Success",
    }


def loopback() -> None:
    """This namespace's loopback up, with the metadata service's address on it."""
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    subprocess.run(["ip", "addr", "add", f"{METADATA_ADDRESS}/32", "dev", "lo"], check=True)


async def probe(work: Path) -> dict[str, object]:
    metadata = await LocalMetadataServer(dialect="aliyun", host=METADATA_ADDRESS, port=80).start()
    metadata.ram_roles[ROLE] = role_credentials("sts-first", timedelta(minutes=5))  # inside the SDK's renewal window
    fake = await FakeAliyun(REGION).start()
    fake.vswitch_zones = {vswitch: zone for zone, vswitch in VSWITCHES.items()}
    fake.spot_prices = {(zone, GPU): 2.0 for zone in VSWITCHES}
    fake.on_demand_prices = {GPU: 10.0}
    with moto_server(work) as s3:
        boto3.client("s3", endpoint_url=s3, **_aws()).create_bucket(Bucket=BUCKET)
        proxy = await S3FaultProxy(s3).start()
        deployed = {"access_key_id": None, "access_key_secret": None, "allow_static_keys": False}
        cloud = AliyunCloud(settings(fake, proxy.endpoint, **deployed))
        try:
            await cloud.launch(job_spec(cloud, "ft-role1"), [GPU], "spot")
            first = len(proxy.credentials)
            metadata.ram_roles[ROLE] = role_credentials("sts-second", timedelta(hours=6))
            await cloud.launch(job_spec(cloud, "ft-role2"), [GPU], "spot")
        finally:
            await cloud.close()
            await proxy.stop()
            await fake.stop()
            await metadata.stop()
    return {
        "oss_tokens": [token for _, token in proxy.credentials],
        "first_launch_requests": first,
        "ecs_rejected": fake.rejected,
        "launched": len(fake.actions("RunInstances")),
        "token_requests": metadata.token_requests,
        "refused_without_token": metadata.refused_without_token,
        "credential_requests": metadata.credential_requests,
    }


def _aws() -> dict[str, str]:
    return {
        "aws_access_key_id": AWS_TEST_ENV["AWS_ACCESS_KEY_ID"],
        "aws_secret_access_key": AWS_TEST_ENV["AWS_SECRET_ACCESS_KEY"],
        "region_name": AWS_TEST_ENV["AWS_REGION"],
    }


if __name__ == "__main__":
    loopback()
    print(json.dumps(asyncio.run(probe(Path(sys.argv[1])))))

"""The bot's own OSS writer (bot/cloud/aliyun/objects.py) against moto behind the fault proxy, as OSS's S3 API."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import boto3
import pytest

from bot.cloud.aliyun.api import Credentials
from bot.cloud.aliyun.objects import OssObjects
from bot.errors import CloudError, CloudRefused, CloudUnavailable, FinetuneError
from tests.broken_http import BrokenHttp
from tests.s3_proxy import S3FaultProxy

BUCKET = "ft-oss"
REGION = "cn-hangzhou"


@pytest.fixture
def bucket(aws: str) -> Any:
    s3 = boto3.client("s3", endpoint_url=aws)
    s3.create_bucket(Bucket=BUCKET)
    return s3


class RotatingKeys:
    """The credentials of each moment, as the RAM role's STS chain hands them out: a new pair on every ask."""

    def __init__(self) -> None:
        self.asked = 0

    async def __call__(self) -> Credentials:
        self.asked += 1
        return Credentials(f"STS.key{self.asked}", f"secret{self.asked}", f"token{self.asked}")


def objects(endpoint: str, keys: RotatingKeys, **changes: Any) -> OssObjects:
    values: dict[str, Any] = {"endpoint": endpoint, "region": REGION, "addressing": "path", "credentials": keys}
    values.update(changes)
    return OssObjects(BUCKET, **values)


@pytest.fixture
def refused_port() -> Iterator[int]:
    """A port bound but not listening: connections to it are refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield int(sock.getsockname()[1])


async def test_put_and_delete_sign_each_call_with_the_credentials_of_that_moment(
    bucket: Any, proxy: S3FaultProxy
) -> None:
    keys = RotatingKeys()
    oss = objects(proxy.endpoint, keys)

    await oss.put("jobs/ft-abc1/control-attempt-1.json", b'{"type": "stop"}')
    await oss.put("jobs/ft-abc1/control-attempt-1.json", b'{"type": "interrupt-test"}')  # overwrites

    body = bucket.get_object(Bucket=BUCKET, Key="jobs/ft-abc1/control-attempt-1.json")["Body"].read()
    assert body == b'{"type": "interrupt-test"}'
    assert proxy.signers("control-attempt-1") == ["STS.key1", "STS.key2"]
    authorizations = [authorization for authorization, _ in proxy.credentials]
    assert all(authorization.startswith("AWS4-HMAC-SHA256 ") for authorization in authorizations)  # SigV4
    assert [token for _, token in proxy.credentials] == ["token1", "token2"]

    await oss.delete("jobs/ft-abc1/control-attempt-1.json")
    await oss.delete("jobs/ft-abc1/control-attempt-1.json")  # already gone: no error
    assert bucket.list_objects_v2(Bucket=BUCKET).get("KeyCount") == 0
    assert proxy.signers("control-attempt-1")[2:] == ["STS.key3", "STS.key4"]


async def test_a_refusal_is_cloud_refused_naming_the_object(bucket: Any, proxy: S3FaultProxy) -> None:
    proxy.refuse = lambda method, path: method == "PUT"
    oss = objects(proxy.endpoint, RotatingKeys())
    with pytest.raises(CloudRefused, match=r"PutObject oss://ft-oss/attempt-keys/i-abc: AccessDenied") as refused:
        await oss.put("attempt-keys/i-abc", b"sealed")
    assert refused.value.code == "AccessDenied"
    assert "HTTP 403" in refused.value.message
    assert "Contents" not in bucket.list_objects_v2(Bucket=BUCKET)


async def test_a_missing_bucket_is_cloud_refused_with_osss_code(aws: str) -> None:
    oss = objects(aws, RotatingKeys())
    with pytest.raises(CloudRefused) as missing:
        await oss.delete("attempt-keys/i-abc")
    assert missing.value.code == "NoSuchBucket"
    assert missing.value.action == "DeleteObject oss://ft-oss/attempt-keys/i-abc"


async def test_no_answer_is_unavailable(refused_port: int) -> None:
    oss = objects(f"http://127.0.0.1:{refused_port}", RotatingKeys(), max_attempts=1)
    with pytest.raises(CloudUnavailable, match=r"PutObject oss://ft-oss/jobs/x: no answer from OSS"):
        await oss.put("jobs/x", b"x")


async def test_no_credentials_is_unavailable_before_any_request(proxy: S3FaultProxy) -> None:
    async def none_found() -> Credentials:
        raise CloudUnavailable("no Alibaba Cloud credentials: nothing in the chain")

    oss = OssObjects(BUCKET, endpoint=proxy.endpoint, region=REGION, addressing="path", credentials=none_found)
    with pytest.raises(CloudUnavailable, match="no Alibaba Cloud credentials"):
        await oss.put("jobs/x", b"x")
    assert proxy.arrived == []


def test_oss_gets_virtual_hosting_sigv4_without_payload_hashing_or_checksum_trailers() -> None:
    """OSS wants bucket host names and rejects aws-chunked bodies: the client is configured for that by default."""
    oss = objects("https://oss-cn-hangzhou.aliyuncs.com", RotatingKeys(), addressing="virtual")
    config = oss.client_config()
    assert config.s3 == {"payload_signing_enabled": False, "addressing_style": "virtual"}
    assert (config.request_checksum_calculation, config.response_checksum_validation) == (
        "when_required",
        "when_required",
    )
    assert config.retries == {"max_attempts": 5, "mode": "standard"}


async def test_an_outage_that_outlasts_the_retries_is_unavailable_not_refused(bucket: Any, proxy: S3FaultProxy) -> None:
    proxy.fail_writes = True  # 503 to every write: OSS down, or throttling without end
    oss = objects(proxy.endpoint, RotatingKeys(), max_attempts=2)
    with pytest.raises(CloudUnavailable, match=r"PutObject oss://ft-oss/jobs/x: OSS answered .*HTTP 503"):
        await oss.put("jobs/x", b"x")
    assert proxy.arrivals("PUT", "jobs/x") > 1  # botocore's retries ran first


@pytest.mark.parametrize(
    ("how", "expected"),
    [
        ("hang-up", CloudUnavailable),
        ("html-502", CloudUnavailable),
        ("html-400", CloudRefused),
        ("empty-500", CloudUnavailable),
        ("not-json-200", CloudUnavailable),
    ],
)
async def test_every_broken_answer_is_one_of_ours(how: str, expected: type[CloudError]) -> None:
    """``not-json-200``: botocore turns a 200 whose body it cannot read into a 500 ClientError, mapped as a 5xx."""
    server = await BrokenHttp(how).start()
    oss = objects(server.endpoint, RotatingKeys(), max_attempts=1)
    try:
        for call in (lambda: oss.put("jobs/x", b"x"), lambda: oss.delete("jobs/x")):
            with pytest.raises(FinetuneError) as caught:
                await call()
            assert type(caught.value) is expected
    finally:
        await server.stop()

"""The AWS provider's mapping: whatever botocore / aiobotocore raises for the provider's calls (ClientError,
EndpointConnectionError, NoCredentialsError, a cut connection, a reply it cannot parse) comes out as
:class:`bot.errors.CloudError` (``AwsError``, or ``LaunchError`` on the launch path), never as botocore's own.

Real servers only: moto answering AWS's error codes, a port nothing listens on, no credentials anywhere, and a
server answering the broken ways a proxy or a dying endpoint does (``tests.broken_http``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from bot.cloud.aws import AwsCloud, AwsSettings
from bot.errors import CloudError
from fakes.ports import free_port
from tests.broken_http import WAYS, BrokenHttp

INSTANCE = "i-0123456789abcdef0"
# One botocore retry (with its backoff) still runs the retry path before the error comes out; the default three
# spend about 3.5 s of backoff on each failing call.
SETTINGS = AwsSettings(bucket="my-bucket", image_id="ami-1", api_retries=1)
Call = Callable[[AwsCloud], Awaitable[Any]]

# The provider's calls that reach EC2 and Auto Scaling without a launch.
CALLS: dict[str, Call] = {
    "list_instances": lambda cloud: cloud.list_instances(),
    "list_groups": lambda cloud: cloud.list_groups(),
    "release_group": lambda cloud: cloud.release_group("ft-abc1-1"),
    "terminate": lambda cloud: cloud.terminate(INSTANCE, "ft-abc1"),
    "stop_runner": lambda cloud: cloud.stop_runner(INSTANCE),
    "spot_zones": lambda cloud: cloud.spot_zones(["g5.xlarge"]),
}


@pytest.fixture
async def cloud(aws: str) -> AsyncIterator[AwsCloud]:
    """A provider on the test's AWS variables (moto by default; a test may point AWS_ENDPOINT_URL elsewhere first)."""
    made = AwsCloud(SETTINGS)
    yield made
    await made.close()


async def assert_all_ours(cloud: AwsCloud, calls: dict[str, Call]) -> None:
    for name, call in calls.items():
        with pytest.raises(Exception) as caught:
            await call(cloud)
        assert isinstance(caught.value, CloudError), f"{name}: {type(caught.value)} {caught.value}"


async def test_moto_refusing_is_a_cloud_error(cloud: AwsCloud) -> None:
    """An instance that does not exist: moto answers AWS's code (InvalidInstanceID.NotFound). (terminate and
    release_group take "gone already" as done: no error to map.)"""
    await assert_all_ours(cloud, {"stop_runner": CALLS["stop_runner"]})


@pytest.mark.parametrize("how", WAYS)
async def test_a_broken_answer_is_a_cloud_error(how: str, aws: str, monkeypatch: pytest.MonkeyPatch) -> None:
    server = await BrokenHttp(how).start()
    monkeypatch.setenv("AWS_ENDPOINT_URL", server.endpoint)
    cloud = AwsCloud(SETTINGS)
    try:
        await assert_all_ours(cloud, CALLS)
        assert server.requests > 0
    finally:
        await cloud.close()
        await server.stop()


async def test_nothing_listening_is_a_cloud_error(aws: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")
    cloud = AwsCloud(SETTINGS)
    try:
        await assert_all_ours(cloud, CALLS)
    finally:
        await cloud.close()


async def test_no_credentials_is_a_cloud_error(aws: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # never ask a real instance metadata service
    cloud = AwsCloud(SETTINGS)
    try:
        await assert_all_ours(cloud, CALLS)
    finally:
        await cloud.close()

"""The AWS provider's mapping (bot/cloud/aws/errors.py, the wrapper every botocore client is handed out in): whatever
botocore / aiobotocore raises for the provider's calls (ClientError, EndpointConnectionError, NoCredentialsError, a cut
connection, a reply it cannot parse) comes out as :class:`bot.errors.CloudError` (``CloudRefused``,
``CloudUnavailable``, or ``LaunchError`` on the launch path), never as botocore's own; its S3 writes (spec, stop
request, key object) as ``CloudRefused`` or ``CloudUnavailable`` naming the object, as OSS's are, which the provider
turns into its port's error naming what it was doing.

Real servers only: moto answering AWS's error codes, a port nothing listens on, no credentials anywhere, and a
server answering the broken ways a proxy or a dying endpoint does (``tests.broken_http``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from bot.cloud.aws.provider import AwsCloud, AwsSettings
from bot.errors import CloudError, CloudRefused, CloudUnavailable, LaunchError
from fakes.ports import free_port
from handlers.report_keys import ReportKeys
from handlers.spec import JobSpec
from tests.broken_http import WAYS, BrokenHttp

INSTANCE = "i-0123456789abcdef0"
# One botocore retry (with its backoff) still runs the retry path before the error comes out; the default three
# spend about 3.5 s of backoff on each failing call. The bucket does not exist on moto.
SETTINGS = AwsSettings(bucket="my-bucket", image_id="ami-1", api_retries=1, runner_role_id="AROAEXAMPLERUNNER")
Call = Callable[[AwsCloud], Awaitable[Any]]
SPEC = JobSpec(version=1, job_id="ft-abc1", attempt=1, command=["true"], checkpoint_uri="s3://my-bucket/ft/ft-abc1/")

# The provider's calls that reach EC2 and Auto Scaling without a launch.
CALLS: dict[str, Call] = {
    "list_instances": lambda cloud: cloud.list_instances(),
    "list_groups": lambda cloud: cloud.list_groups(),
    "release_group": lambda cloud: cloud.release_group("ft-abc1-1"),
    "terminate": lambda cloud: cloud.terminate(INSTANCE, "ft-abc1"),
    "stop_runner": lambda cloud: cloud.stop_runner(INSTANCE),
    "spot_zones": lambda cloud: cloud.spot_zones(["g5.xlarge"]),
}

# The provider's S3 writes, each an object-store call of its own.
WRITES: dict[str, Call] = {
    "upload_spec": lambda cloud: cloud.objects.upload_spec(SPEC),
    "put_stop": lambda cloud: cloud.objects.put_stop("ft-abc1", 1),
    "write_key": lambda cloud: cloud.objects.write_key("ft-abc1", 1, "5a" * 16, INSTANCE),
}


@pytest.fixture
async def cloud(aws: str) -> AsyncIterator[AwsCloud]:
    """A provider on the test's AWS variables (moto by default; a test may point AWS_ENDPOINT_URL elsewhere first)."""
    made = AwsCloud(SETTINGS, report_keys=ReportKeys("master"))
    yield made
    await made.close()


async def assert_all_ours(cloud: AwsCloud, calls: dict[str, Call], expected: type[CloudError] = CloudError) -> None:
    for name, call in calls.items():
        with pytest.raises(Exception) as caught:
            await call(cloud)
        assert isinstance(caught.value, expected), f"{name}: {type(caught.value)} {caught.value}"


async def assert_writes_fail_as(cloud: AwsCloud, expected: type[CloudError]) -> None:
    """Every S3 write raises exactly ``expected`` (CloudRefused or CloudUnavailable naming the object, never
    botocore's)."""
    for name, call in WRITES.items():
        with pytest.raises(Exception) as caught:
            await call(cloud)
        assert type(caught.value) is expected, f"{name}: {type(caught.value)} {caught.value}"
        assert " s3://my-bucket/" in str(caught.value), f"{name} does not name its object: {caught.value}"


async def test_moto_refusing_is_a_cloud_error(cloud: AwsCloud) -> None:
    """An instance that does not exist: moto answers AWS's code (InvalidInstanceID.NotFound). (terminate and
    release_group take "gone already" as done: no error to map.)"""
    await assert_all_ours(cloud, {"stop_runner": CALLS["stop_runner"]})


async def test_s3_refusing_a_write_is_cloud_refused_with_its_code(cloud: AwsCloud) -> None:
    """moto has no bucket ``my-bucket``: S3 answers NoSuchBucket to each write, naming the object."""
    await assert_writes_fail_as(cloud, CloudRefused)
    where = r"PutObject s3://my-bucket/jobs/ft-abc1/control/attempt-1\.json: NoSuchBucket"
    with pytest.raises(CloudRefused, match=where) as caught:
        await cloud.objects.put_stop("ft-abc1", 1)
    assert caught.value.code == "NoSuchBucket"


async def test_a_spec_s3_refused_is_a_launch_error_caused_by_the_object_store(cloud: AwsCloud) -> None:
    """The provider keeps its port's contract (only CloudErrors) and says which write failed; nothing started."""
    with pytest.raises(LaunchError, match="could not upload the spec of ft-abc1 attempt 1") as caught:
        await cloud.launch(SPEC, ["g5.xlarge"], "spot")
    assert isinstance(caught.value.__cause__, CloudRefused)
    ec2 = await cloud.clients.get("ec2")
    assert (await ec2.describe_instances())["Reservations"] == []


# What each broken way makes of an S3 write: a 5xx, or a 200 botocore cannot read (it turns that into a 500), is
# unavailable; a 400 is refused.
WRITE_FAILS_AS: dict[str, type[CloudError]] = {
    "hang-up": CloudUnavailable,
    "html-502": CloudUnavailable,
    "html-400": CloudRefused,
    "empty-500": CloudUnavailable,
    "not-json-200": CloudUnavailable,
}


@pytest.mark.parametrize("how", WAYS)
async def test_a_broken_answer_is_a_cloud_error(how: str, aws: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The provider's calls come out as CloudErrors, its S3 writes as CloudRefused or CloudUnavailable."""
    server = await BrokenHttp(how).start()
    monkeypatch.setenv("AWS_ENDPOINT_URL", server.endpoint)
    cloud = AwsCloud(SETTINGS, report_keys=ReportKeys("master"))
    try:
        await assert_all_ours(cloud, CALLS)
        await assert_writes_fail_as(cloud, WRITE_FAILS_AS[how])
        assert server.requests > 0
    finally:
        await cloud.close()
        await server.stop()


async def test_nothing_listening_is_a_cloud_error(aws: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")
    cloud = AwsCloud(SETTINGS, report_keys=ReportKeys("master"))
    try:
        # No answer at all: each call says so (trying later may work), as Alibaba's do.
        answered = {name: call for name, call in CALLS.items() if name != "spot_zones"}  # the launch path's
        await assert_all_ours(cloud, answered, CloudUnavailable)
        await assert_all_ours(cloud, CALLS)
        await assert_writes_fail_as(cloud, CloudUnavailable)
    finally:
        await cloud.close()


async def test_no_credentials_is_a_cloud_error(aws: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # never ask a real instance metadata service
    cloud = AwsCloud(SETTINGS, report_keys=ReportKeys("master"))
    try:
        await assert_all_ours(cloud, CALLS)
        await assert_writes_fail_as(cloud, CloudUnavailable)
    finally:
        await cloud.close()

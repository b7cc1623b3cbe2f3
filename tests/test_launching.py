"""The one launch loop (bot/cloud/launching.py), driven the same way through both clouds that use it: AWS on moto
(through the EC2 proxy that injects capacity errors) and Alibaba on its OpenAPI double. Both must walk the zones in
the order the spot authority is given (``spot_zones``, zones to avoid last), move on past a capacity error, stop at
any other error, send one idempotency token per candidate, and find the instance a first try started."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import boto3
import pytest

from bot.cloud.aliyun.provider import AliyunCloud
from bot.cloud.aws.provider import AwsCloud
from bot.cloud.base import LaunchError
from handlers.spec import JobSpec
from tests.aliyun_fakes import FakeAliyun
from tests.aws_fakes import Ec2Proxy
from tests.test_aliyun_cloud import GPU
from tests.test_aliyun_cloud import settings as aliyun_settings
from tests.test_aws_cloud import build_world

CAPACITY = {"aws": "InsufficientInstanceCapacity", "aliyun": "OperationDenied.NoStock"}
FATAL = {"aws": "InvalidAMIID.NotFound", "aliyun": "InvalidImageId.NotFound"}
ZONE_PARAM = {"aws": "Placement.AvailabilityZone", "aliyun": "ZoneId"}


@dataclass
class Cloud:
    """One cloud under test: the provider, its instance type, and its double's RunInstances requests and faults."""

    kind: str
    provider: AwsCloud | AliyunCloud
    instance_type: str
    requests: Callable[[], list[dict[str, str]]]
    set_fault: Callable[[Callable[[dict[str, str]], str | None]], None]

    def tried(self) -> list[str]:
        """The zone of every RunInstances request, in order."""
        return [form[ZONE_PARAM[self.kind]] for form in self.requests()]

    def faults(self, by_zone: dict[str, str]) -> None:
        """RunInstances in these zones answers the cloud's own error code."""
        self.set_fault(lambda form: by_zone.get(form.get(ZONE_PARAM[self.kind], "")))

    def spec(self, attempt: int = 1) -> JobSpec:
        return JobSpec(
            version=1,
            job_id="ft-loop",
            attempt=attempt,
            command=["python", "-m", "runner.hf.tiny"],
            checkpoint_uri=self.provider.checkpoint_uri("ft-loop"),
            notice=self.provider.notice,
        )


# Every test here runs the loop through moto or the Alibaba OpenAPI double, chosen by a parametrised fixture.
pytestmark = pytest.mark.scenario

@pytest.fixture
async def aws_cloud(aws: str, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Cloud]:
    world = build_world(aws)
    proxy = await Ec2Proxy(world.endpoint).start()
    monkeypatch.setenv("AWS_ENDPOINT_URL_EC2", proxy.endpoint)
    provider = AwsCloud(world.settings(max_launch_failures=None))

    def set_fault(fault: Callable[[dict[str, str]], str | None]) -> None:
        proxy.run_instances_fault = fault

    yield Cloud("aws", provider, "g5.xlarge", lambda: proxy.actions("RunInstances"), set_fault)
    await provider.close()
    await proxy.stop()


@pytest.fixture
async def aliyun_cloud(aws: str, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Cloud]:
    monkeypatch.setenv("ALIBABA_CLOUD_ECS_METADATA_DISABLED", "true")
    fake = await FakeAliyun("cn-hangzhou").start()
    settings = aliyun_settings(fake, aws, max_launch_failures=None)
    fake.vswitch_zones = {vswitch: zone for zone, vswitch in settings.vswitches.items()}
    boto3.client("s3", endpoint_url=aws).create_bucket(Bucket=settings.bucket)
    provider = AliyunCloud(settings)

    def set_fault(fault: Callable[[dict[str, str]], str | None]) -> None:
        fake.run_fault = fault

    yield Cloud("aliyun", provider, GPU, lambda: fake.actions("RunInstances"), set_fault)
    await provider.close()
    await fake.stop()


@pytest.fixture(params=["aws", "aliyun"])
def cloud(request: pytest.FixtureRequest) -> Any:
    return request.getfixturevalue(f"{request.param}_cloud")


async def test_capacity_moves_on_in_the_authoritys_order_with_avoided_zones_last(cloud: Cloud) -> None:
    first, second, third = await cloud.provider.spot_zones([cloud.instance_type])
    cloud.faults({second: CAPACITY[cloud.kind]})
    instance = await cloud.provider.launch(cloud.spec(), [cloud.instance_type], "on-demand", avoid_zones=[first])
    assert cloud.tried() == [second, third]  # avoided last; past the capacity error to the next zone
    assert (instance.zone, instance.market) == (third, "on-demand")
    tokens = [form["ClientToken"] for form in cloud.requests()]
    assert len(set(tokens)) == 2 and all(tokens)  # one idempotency token per candidate

    again = await cloud.provider.launch(cloud.spec(), [cloud.instance_type], "on-demand", avoid_zones=[first])
    assert again.instance_id == instance.instance_id  # a retried launch finds what the first try started
    assert cloud.tried() == [second, third]  # and starts nothing


async def test_a_non_capacity_error_stops_the_loop(cloud: Cloud) -> None:
    first, second, _ = await cloud.provider.spot_zones([cloud.instance_type])
    cloud.faults({first: CAPACITY[cloud.kind], second: FATAL[cloud.kind]})
    with pytest.raises(LaunchError, match=f"launch refused: on-demand .* in {second}: {FATAL[cloud.kind]}") as caught:
        await cloud.provider.launch(cloud.spec(), [cloud.instance_type], "on-demand")
    assert not caught.value.capacity  # not the market's room: the authority is not asked to choose again
    assert cloud.tried() == [first, second]  # third never tried


async def test_a_pinned_zone_without_room_is_a_capacity_refusal_there_only(cloud: Cloud) -> None:
    first, second, third = await cloud.provider.spot_zones([cloud.instance_type])
    cloud.faults({zone: CAPACITY[cloud.kind] for zone in (first, second, third)})
    with pytest.raises(LaunchError, match="every candidate failed") as caught:
        await cloud.provider.launch(cloud.spec(), [cloud.instance_type], "spot", zone=second)
    assert (caught.value.capacity, caught.value.zone) == (True, second)
    assert cloud.tried() == [second]

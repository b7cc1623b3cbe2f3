"""AwsCloud against moto in server mode, with an EC2 proxy for what moto cannot do (see tests/aws_fakes.py).

moto supplies: S3, EC2 RunInstances with spot market options (InstanceLifecycle "spot"), tags on instances
and volumes, user-data, a constant spot price history, Auto Scaling groups with mixed instances policies and
launch template versions, FIS templates and experiments (as records only), IAM instance profiles.
The proxy fakes: capacity errors, placement scores, distinct spot prices, an FIS AccessDenied. The test itself
delivers the effect of an FIS spot interruption (moto's FIS has none).
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import re
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

import boto3
import pytest
from pydantic import ValidationError

import bot.cloud.base as cloud_base
from bot.cloud.aws.autoscaling import group_distribution
from bot.cloud.aws.provider import AwsCloud
from bot.cloud.aws.settings import AwsSettings
from bot.cloud.base import CloudError, ForeignInstance, LaunchError, launches_ahead
from bot.cloud_effects import CloudEffects
from bot.errors import ConfigError
from bot.keys import Keys
from bot.reconciler import Reconciler
from bot.store import JobStore
from fakes.ports import free_port
from handlers.change import Change
from handlers.decide import decide, new_job, resume_command, stop_command
from handlers.jobs import Attempt, Job, JobState
from handlers.lifecycle import Lifecycle
from handlers.messages import CloudEvent, Launched, LaunchFailed, ReportReceived, StopDeadline
from handlers.recipes import BUILT_IN
from handlers.report_keys import ReportKeys
from handlers.reports import Started
from handlers.spec import JobSpec, parse_spec
from handlers.spot import SpotView
from tests.aws_fakes import Ec2Proxy, deliver_fis_interruption, spot_request
from tests.outboxes import dumped
from tests.redis_fixtures import (  # noqa: F401 (fixtures)
    fixture_key_prefix,
    fixture_redis_client,
    fixture_redis_client_factory,
    fixture_valkey_url,
)
from tests.s3_proxy import S3FaultProxy
from tests.servers import AWS_TEST_ENV, reset_moto

BUCKET = "ft-ckpt"
SALT = "5a" * 16  # the key salt of every attempt job_spec makes (the job record's, in the bot)
ZONES = ["us-east-1a", "us-east-1b", "us-east-1c"]
ZONE_IDS = {"us-east-1a": "use1-az6", "us-east-1b": "use1-az1", "us-east-1c": "use1-az2"}  # moto's mapping
FIS_ROLE = "arn:aws:iam::123456789012:role/finetune-fis"
RUNNER_ROLE_ID = "AROAEXAMPLERUNNERROLE"  # the runner stack's output RunnerRoleId
TYPES = ["g5.xlarge", "g6.xlarge"]


@dataclass
class World:
    endpoint: str
    ec2: Any
    s3: Any
    fis: Any
    asg: Any
    subnets: dict[str, str]
    security_group: str
    image_id: str

    def settings(self, **changes: Any) -> AwsSettings:
        values: dict[str, Any] = {
            "bucket": BUCKET,
            "subnets": self.subnets,
            "zones": ZONES,
            "security_group_ids": [self.security_group],
            "instance_profile": "finetune-runner",
            "image_id": self.image_id,
            "fis_role_arn": FIS_ROLE,
            "runner_role_id": RUNNER_ROLE_ID,
            "group_poll_seconds": 0.2,
            "group_wait_seconds": 10,
        }
        values.update(changes)
        return AwsSettings(**values)

    def instance(self, instance_id: str) -> dict[str, Any]:
        reservations = self.ec2.describe_instances(InstanceIds=[instance_id])["Reservations"]
        return dict(reservations[0]["Instances"][0])

    def user_data(self, instance_id: str) -> str:
        value = self.ec2.describe_instance_attribute(InstanceId=instance_id, Attribute="userData")["UserData"]["Value"]
        return base64.b64decode(value).decode()

    def object(self, key: str) -> bytes:
        return bytes(self.s3.get_object(Bucket=BUCKET, Key=key)["Body"].read())

    def keys_under(self, prefix: str) -> list[str]:
        return [item["Key"] for item in self.s3.list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("Contents", [])]

    def key_object_of(self, instance_id: str) -> str:
        return f"attempt-keys/{RUNNER_ROLE_ID}:{instance_id}"


def build_world(endpoint: str) -> World:
    """Bucket, a VPC with a subnet in three zones, a security group, an instance profile and an AMI, made with
    clients that talk to moto directly (never through the proxy, which runs on the test's event loop)."""

    def client(service: str) -> Any:
        return boto3.client(service, endpoint_url=endpoint, region_name="us-east-1")

    ec2, s3 = client("ec2"), client("s3")
    s3.create_bucket(Bucket=BUCKET)
    vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
    subnets = {
        zone: ec2.create_subnet(VpcId=vpc, CidrBlock=f"10.0.{index}.0/24", AvailabilityZone=zone)["Subnet"]["SubnetId"]
        for index, zone in enumerate(ZONES)
    }
    group = ec2.create_security_group(GroupName="finetune", Description="runner", VpcId=vpc)["GroupId"]
    client("iam").create_instance_profile(InstanceProfileName="finetune-runner")
    # Filtered: all of moto's ~1300 images take seconds to list.
    images = ec2.describe_images(Owners=["amazon"], Filters=[{"Name": "name", "Values": ["amzn2-ami-hvm-*"]}])
    image = images["Images"][0]["ImageId"]
    return World(endpoint, ec2, s3, client("fis"), client("autoscaling"), subnets, group, image)


@pytest.fixture
def world(aws: str) -> World:
    return build_world(aws)


@pytest.fixture
async def proxy(world: World, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Ec2Proxy]:
    """Every EC2 and FIS call of the provider goes through the proxy (botocore's per-service endpoint)."""
    started = await Ec2Proxy(world.endpoint).start()
    monkeypatch.setenv("AWS_ENDPOINT_URL_EC2", started.endpoint)
    monkeypatch.setenv("AWS_ENDPOINT_URL_FIS", started.endpoint)
    yield started
    await started.stop()


@pytest.fixture(autouse=True)
def fresh_log_once(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(cloud_base, "_logged_once", set())
    yield


@pytest.fixture
async def open_clouds() -> AsyncIterator[list[AwsCloud]]:
    clouds: list[AwsCloud] = []
    yield clouds
    for cloud in clouds:
        await cloud.close()


@pytest.fixture
def make_cloud(world: World, proxy: Ec2Proxy, open_clouds: list[AwsCloud]) -> Any:
    def make(**changes: Any) -> AwsCloud:
        cloud = AwsCloud(world.settings(**changes))
        open_clouds.append(cloud)
        return cloud

    return make


def job_spec(cloud: AwsCloud, job_id: str = "ft-abc1", attempt: int = 1) -> JobSpec:
    return JobSpec(
        version=1,
        job_id=job_id,
        attempt=attempt,
        command=["python", "-m", "runner.hf.tiny"],
        checkpoint_uri=cloud.checkpoint_uri(job_id),
        notice="aws",
        key_salt=SALT,
    )


def test_settings_and_names() -> None:
    cloud = AwsCloud(AwsSettings(bucket="my-bucket", image_id="ami-1"))
    assert (cloud.name, cloud.notice) == ("aws", "aws")
    assert cloud.checkpoint_uri("ft-7k2q") == "s3://my-bucket/jobs/ft-7k2q/"
    assert cloud.spec_key("ft-7k2q", 2) == "jobs/ft-7k2q/spec-attempt-2.json"
    with pytest.raises(ValidationError, match="image_id"):
        AwsSettings(bucket="my-bucket")
    with pytest.raises(ValidationError, match="subnets"):
        AwsSettings(bucket="my-bucket", image_id="ami-1", mode="autoscaling")
    with pytest.raises(ValidationError):
        AwsSettings(bucket="my-bucket", image_id="ami-1", work_dir="/tmp/x'; rm -rf /")


async def test_spot_launch_tags_market_options_and_user_data(world: World, proxy: Ec2Proxy, make_cloud: Any) -> None:
    cloud: AwsCloud = make_cloud()
    instance = await cloud.launch(job_spec(cloud), ["g5.xlarge"], "spot")

    # Equal (moto) prices and no scores: the configured zone order decides.
    assert (instance.zone, instance.instance_type, instance.market) == ("us-east-1a", "g5.xlarge", "spot")
    assert instance.price_per_hour == pytest.approx(0.00001)  # moto's spot price history
    assert instance.on_demand_price_per_hour == pytest.approx(1.006)
    described = world.instance(instance.instance_id)
    assert described["InstanceLifecycle"] == "spot"
    assert described["SubnetId"] == world.subnets["us-east-1a"]
    # IMDSv2 only, hop limit 1: no container on the host reaches the role's credentials.
    assert described["MetadataOptions"]["HttpTokens"] == "required"
    assert described["MetadataOptions"]["HttpPutResponseHopLimit"] == 1
    assert described["MetadataOptions"]["HttpEndpoint"] == "enabled"
    tags = {tag["Key"]: tag["Value"] for tag in described["Tags"]}
    # finetune:managed: the bot's IAM policy terminates (and the FIS role interrupts) only instances tagged so.
    assert tags == {
        "finetune:managed": "true",
        "finetune:job": "ft-abc1",
        "finetune:attempt": "1",
        "Name": "finetune-ft-abc1-1",
    }
    volumes = world.ec2.describe_volumes(Filters=[{"Name": "attachment.instance-id", "Values": [instance.instance_id]}])
    assert all({"Key": "finetune:job", "Value": "ft-abc1"} in volume["Tags"] for volume in volumes["Volumes"])

    (run,) = proxy.actions("RunInstances")
    assert run["MetadataOptions.HttpTokens"] == "required" and run["MetadataOptions.HttpPutResponseHopLimit"] == "1"
    assert run["InstanceMarketOptions.MarketType"] == "spot"
    assert run["InstanceMarketOptions.SpotOptions.SpotInstanceType"] == "one-time"
    assert run["InstanceMarketOptions.SpotOptions.InstanceInterruptionBehavior"] == "terminate"
    assert run["IamInstanceProfile.Name"] == "finetune-runner"
    assert run["SecurityGroupId.1"] == world.security_group

    script = world.user_data(instance.instance_id)
    assert script.startswith("#!/bin/bash\n")
    assert "FINETUNE_SPEC=s3://ft-ckpt/jobs/ft-abc1/spec-attempt-1.json\n" in script
    assert "AWS_REGION=us-east-1\n" in script
    assert "FINETUNE_STORAGE_REGION=us-east-1\n" in script  # the bucket's (home) region, wherever the runner is
    assert "systemctl enable --now finetune-runner.service" in script
    assert not any(word in script for word in ("pip ", "apt", "curl", "wget"))  # installs nothing at boot
    spec = parse_spec(world.object("jobs/ft-abc1/spec-attempt-1.json"))
    assert spec.job_id == "ft-abc1"
    assert spec.attempt == 1
    assert spec.release is None  # the bot releases on completion: a runner's role may end no instance


async def test_a_launch_carried_out_again_finds_the_attempts_instance(
    world: World, proxy: Ec2Proxy, make_cloud: Any
) -> None:
    """A replica died after RunInstances but before recording it: the retry must not start a second instance,
    even when it would try another zone first (here the first zone now refuses)."""
    cloud: AwsCloud = make_cloud()
    first = await cloud.launch(job_spec(cloud), ["g5.xlarge"], "spot")
    proxy.run_instances_fault = lambda form: (
        "InsufficientInstanceCapacity" if form.get("Placement.AvailabilityZone") == first.zone else None
    )

    again = await cloud.launch(job_spec(cloud), ["g5.xlarge"], "spot")

    assert again == first
    (run,) = proxy.actions("RunInstances")  # no second request at all
    assert len(run["ClientToken"]) == 32
    other = await cloud.launch(job_spec(cloud, attempt=2), ["g5.xlarge"], "spot")  # another attempt: its own
    assert other.instance_id != first.instance_id
    tokens = [form["ClientToken"] for form in proxy.actions("RunInstances")]
    assert len(set(tokens)) == len(tokens) == 3  # the refused try and the new launch each had their own token


async def test_spec_gets_the_sns_report_topic(world: World, make_cloud: Any) -> None:
    topic = "arn:aws:sns:us-east-1:123456789012:finetune-reports"
    cloud: AwsCloud = make_cloud(report_topic_arn=topic)
    await cloud.launch(job_spec(cloud), ["g5.xlarge"], "spot")
    assert parse_spec(world.object("jobs/ft-abc1/spec-attempt-1.json")).report == [f"sns:{topic}"]


async def test_without_placement_scores_falls_back_and_logs_once(
    proxy: Ec2Proxy, make_cloud: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="bot.cloud.aws.pricing")
    proxy.spot_prices = {("us-east-1a", "g5.xlarge"): 0.52, ("us-east-1b", "g5.xlarge"): 0.41}
    first: AwsCloud = make_cloud()
    second: AwsCloud = make_cloud()
    launched = [await first.launch(job_spec(first, attempt=n), ["g5.xlarge"], "spot") for n in (1, 2)]
    launched.append(await second.launch(job_spec(second, attempt=3), ["g5.xlarge"], "spot"))

    # moto has no GetSpotPlacementScores (HTTP 500): asked once per provider, never retried, logged once.
    assert len(proxy.actions("GetSpotPlacementScores")) == 2
    notes = [r for r in caplog.records if "placement scores unavailable" in r.getMessage()]
    assert len(notes) == 1
    # The fallback order is the spot price (1b is cheaper), then the configured order (1c before 1a: unpriced).
    assert [i.zone for i in launched] == ["us-east-1b"] * 3
    assert launched[0].price_per_hour == pytest.approx(0.41)


async def test_placement_scores_then_price_then_zone_order(proxy: Ec2Proxy, make_cloud: Any) -> None:
    proxy.placement_scores = {ZONE_IDS["us-east-1a"]: 9, ZONE_IDS["us-east-1b"]: 3, ZONE_IDS["us-east-1c"]: 9}
    proxy.spot_prices = {
        ("us-east-1a", "g5.xlarge"): 0.40,
        ("us-east-1a", "g6.xlarge"): 0.35,
        ("us-east-1b", "g6.xlarge"): 0.10,
        ("us-east-1c", "g5.xlarge"): 0.45,
        ("us-east-1c", "g6.xlarge"): 0.30,
    }
    cloud: AwsCloud = make_cloud()
    best = await cloud.launch(job_spec(cloud), TYPES, "spot")
    assert (best.zone, best.instance_type, best.price_per_hour) == ("us-east-1c", "g6.xlarge", 0.30)
    (asked,) = proxy.actions("GetSpotPlacementScores")
    assert asked["SingleAvailabilityZone"] == "true"
    assert asked["TargetCapacity"] == "1"
    assert {asked["InstanceType.1"], asked["InstanceType.2"]} == set(TYPES)

    # The zone that just reclaimed the job goes last: the other score-9 zone is next.
    moved = await cloud.launch(job_spec(cloud, attempt=2), TYPES, "spot", avoid_zones=["us-east-1c"])
    assert (moved.zone, moved.instance_type) == ("us-east-1a", "g6.xlarge")


async def test_capacity_error_moves_to_the_next_zone(world: World, proxy: Ec2Proxy, make_cloud: Any) -> None:
    proxy.run_instances_fault = lambda form: (
        "InsufficientInstanceCapacity" if form.get("Placement.AvailabilityZone") == "us-east-1a" else None
    )
    cloud: AwsCloud = make_cloud()
    instance = await cloud.launch(job_spec(cloud), ["g5.xlarge"], "spot")

    assert (instance.zone, instance.market) == ("us-east-1b", "spot")
    assert world.instance(instance.instance_id)["InstanceLifecycle"] == "spot"
    zones = [form["Placement.AvailabilityZone"] for form in proxy.actions("RunInstances")]
    assert zones == ["us-east-1a", "us-east-1b"]  # the HTTP 500 was not retried in the same zone


async def test_a_list_of_subnets_is_placed_by_the_zones_ec2_reports(
    world: World, proxy: Ec2Proxy, make_cloud: Any
) -> None:
    """The runner stack exports its subnets as a list: the bot asks EC2 once which zone each is in."""
    proxy.run_instances_fault = lambda form: (
        "InsufficientInstanceCapacity" if form.get("Placement.AvailabilityZone") == "us-east-1b" else None
    )
    cloud: AwsCloud = make_cloud(subnets=[world.subnets["us-east-1b"], world.subnets["us-east-1c"]], zones=[])
    first = await cloud.launch(job_spec(cloud), ["g5.xlarge"], "spot")
    second = await cloud.launch(job_spec(cloud, attempt=2), ["g5.xlarge"], "spot", avoid_zones=["us-east-1c"])

    assert (first.zone, second.zone) == ("us-east-1c", "us-east-1c")  # 1b has no capacity; 1a is not listed
    assert world.instance(first.instance_id)["SubnetId"] == world.subnets["us-east-1c"]
    runs = [(form["Placement.AvailabilityZone"], form["SubnetId"]) for form in proxy.actions("RunInstances")]
    assert runs[:2] == [("us-east-1b", world.subnets["us-east-1b"]), ("us-east-1c", world.subnets["us-east-1c"])]
    assert len(proxy.actions("DescribeSubnets")) == 1  # looked up once per provider

    vpc = world.instance(first.instance_id)["VpcId"]
    another = world.ec2.create_subnet(VpcId=vpc, CidrBlock="10.0.9.0/24", AvailabilityZone="us-east-1a")["Subnet"]
    # Another job each: a launch of ft-abc1's attempt 1 again would find the instance it started (no new launch).
    doubled = make_cloud(subnets=[world.subnets["us-east-1a"], another["SubnetId"]], zones=[])
    with pytest.raises(LaunchError, match="both in us-east-1a: give one per zone"):
        await doubled.launch(job_spec(doubled, "ft-dbl1"), ["g5.xlarge"], "spot")
    missing = make_cloud(subnets=["subnet-0000dead"], zones=[])
    with pytest.raises(LaunchError, match="subnet-0000dead"):
        await missing.launch(job_spec(missing, "ft-mis1"), ["g5.xlarge"], "spot")


async def test_a_zone_the_spot_policy_chose_is_tried_alone_and_a_refusal_says_capacity(
    world: World, proxy: Ec2Proxy, make_cloud: Any
) -> None:
    proxy.spot_prices = {("us-east-1a", "g5.xlarge"): 0.52, ("us-east-1b", "g5.xlarge"): 0.41}
    proxy.run_instances_fault = lambda form: (
        "InsufficientInstanceCapacity" if form.get("Placement.AvailabilityZone") == "us-east-1b" else None
    )
    cloud: AwsCloud = make_cloud(max_launch_failures=1)
    pinned = await cloud.launch(job_spec(cloud), ["g5.xlarge"], "spot", zone="us-east-1a")
    # There, at the price EC2's spot price history gives for it now (recorded on the attempt).
    assert (pinned.zone, pinned.market, pinned.price_per_hour) == ("us-east-1a", "spot", pytest.approx(0.52))

    with pytest.raises(LaunchError) as refused:
        await cloud.launch(job_spec(cloud, attempt=2), ["g5.xlarge"], "spot", zone="us-east-1b")
    assert refused.value.capacity and refused.value.zone == "us-east-1b"
    tried = [(form["Placement.AvailabilityZone"], spot_request(form)) for form in proxy.actions("RunInstances")]
    assert tried == [("us-east-1a", True), ("us-east-1b", True)]  # no other zone, no on-demand


async def test_max_capacity_failures_end_in_a_capacity_refusal_never_on_demand(
    proxy: Ec2Proxy, make_cloud: Any
) -> None:
    codes = iter(["InsufficientInstanceCapacity", "SpotMaxPriceTooLow", "MaxSpotInstanceCountExceeded"] * 3)
    proxy.run_instances_fault = lambda form: next(codes) if spot_request(form) else None
    cloud: AwsCloud = make_cloud(max_launch_failures=3)
    with pytest.raises(LaunchError) as refused:
        await cloud.launch(job_spec(cloud), TYPES, "spot")
    assert refused.value.capacity  # the spot authority chooses again (handlers/spot/): on-demand is its to choose

    runs = proxy.actions("RunInstances")
    assert [spot_request(form) for form in runs] == [True, True, True]  # 6 spot candidates, 3 tried, no on-demand


async def test_on_demand_market_skips_spot_entirely(world: World, proxy: Ec2Proxy, make_cloud: Any) -> None:
    cloud: AwsCloud = make_cloud()
    instance = await cloud.launch(job_spec(cloud), ["g6.xlarge"], "on-demand")
    assert (instance.market, instance.price_per_hour) == ("on-demand", pytest.approx(0.805))
    (run,) = proxy.actions("RunInstances")
    assert not any(key.startswith("InstanceMarketOptions") for key in run)
    assert not proxy.actions("GetSpotPlacementScores")
    assert "InstanceLifecycle" not in world.instance(instance.instance_id)


async def test_no_capacity_anywhere_is_a_launch_error(proxy: Ec2Proxy, make_cloud: Any) -> None:
    proxy.run_instances_fault = lambda form: "InsufficientInstanceCapacity"
    cloud: AwsCloud = make_cloud(max_launch_failures=None)
    with pytest.raises(LaunchError, match="every candidate failed") as caught:
        await cloud.launch(job_spec(cloud), ["g5.xlarge"], "on-demand")
    # On-demand in every zone; the message names each try.
    assert len(proxy.actions("RunInstances")) == len(ZONES)
    assert "on-demand g5.xlarge in us-east-1c: InsufficientInstanceCapacity" in str(caught.value)


async def test_a_configuration_error_stops_at_once(world: World, proxy: Ec2Proxy, make_cloud: Any) -> None:
    cloud: AwsCloud = make_cloud(subnets={**world.subnets, "us-east-1a": "subnet-0000dead"})
    refused = "launch refused: spot g5.xlarge in us-east-1a: InvalidSubnetID.NotFound"
    with pytest.raises(LaunchError, match=re.escape(refused)):
        await cloud.launch(job_spec(cloud), ["g5.xlarge"], "spot")
    assert len(proxy.actions("RunInstances")) == 1  # not a capacity problem: no other zone is tried


async def test_stop_runner_writes_the_control_object(world: World, make_cloud: Any) -> None:
    cloud: AwsCloud = make_cloud()
    instance = await cloud.launch(job_spec(cloud, attempt=2), ["g5.xlarge"], "spot")
    await cloud.stop_runner(instance.instance_id)
    assert json.loads(world.object("jobs/ft-abc1/control/attempt-2.json")) == {"type": "stop"}
    with pytest.raises(CloudError, match="does not exist"):
        await cloud.stop_runner("i-0123456789abcdef0")


async def test_save_runner_writes_a_save_request_to_the_control_object(world: World, make_cloud: Any) -> None:
    cloud: AwsCloud = make_cloud()
    instance = await cloud.launch(job_spec(cloud, attempt=2), ["g5.xlarge"], "spot")
    await cloud.save_runner(instance.instance_id, datetime(2026, 12, 7, 12, tzinfo=UTC))
    written = json.loads(world.object("jobs/ft-abc1/control/attempt-2.json"))
    assert written == {"type": "save", "at": "2026-12-07T12:00:00Z"}
    with pytest.raises(CloudError, match="does not exist"):
        await cloud.save_runner("i-0123456789abcdef0", datetime(2026, 12, 7, 12, tzinfo=UTC))


async def test_hand_over_writes_go_to_the_attempt_launched_ahead(world: World, make_cloud: Any) -> None:
    cloud: AwsCloud = make_cloud()
    await cloud.launch(job_spec(cloud, attempt=3), ["g5.xlarge"], "spot")
    await cloud.hand_over("ft-abc1", 3)
    assert json.loads(world.object("jobs/ft-abc1/control/attempt-3.json")) == {"type": "go"}


async def test_terminate_is_idempotent(world: World, make_cloud: Any) -> None:
    cloud: AwsCloud = make_cloud()
    instance = await cloud.launch(job_spec(cloud), ["g5.xlarge"], "spot")
    await cloud.terminate(instance.instance_id, "ft-abc1")
    assert world.instance(instance.instance_id)["State"]["Name"] in ("shutting-down", "terminated")
    await cloud.terminate(instance.instance_id, "ft-abc1")
    await cloud.terminate("i-0123456789abcdef0", "ft-abc1")


async def test_terminate_never_touches_an_instance_not_tagged_for_the_job(world: World, make_cloud: Any) -> None:
    """A stale effect or a forged report cannot end another job's instance, nor one the bot never launched."""
    cloud: AwsCloud = make_cloud()
    other = await cloud.launch(job_spec(cloud, "ft-bbbb"), ["g5.xlarge"], "spot")
    stranger = world.ec2.run_instances(ImageId=world.image_id, MinCount=1, MaxCount=1, InstanceType="t3.micro")
    untagged = stranger["Instances"][0]["InstanceId"]
    for instance_id, tagged_for in ((other.instance_id, "ft-bbbb"), (untagged, "no job")):
        with pytest.raises(ForeignInstance, match=f"tagged for {tagged_for}, not ft-aaaa"):
            await cloud.terminate(instance_id, "ft-aaaa")
        assert world.instance(instance_id)["State"]["Name"] in ("pending", "running")
    await cloud.terminate(other.instance_id, "ft-bbbb")  # its own job may
    assert world.instance(other.instance_id)["State"]["Name"] in ("shutting-down", "terminated")


async def test_every_refusal_is_a_cloud_error_never_a_raw_botocore_one(proxy: Ec2Proxy, make_cloud: Any) -> None:
    """The executor catches CloudError only (bot/cloud_effects.py): a ClientError escaping would be taken for a bug."""
    cloud: AwsCloud = make_cloud()
    instance = await cloud.launch(job_spec(cloud), ["g5.xlarge"], "spot")
    proxy.denied_actions = {"TerminateInstances"}
    with pytest.raises(CloudError, match=r"could not terminate .*UnauthorizedOperation") as refused:
        await cloud.terminate(instance.instance_id, "ft-abc1")
    assert isinstance(refused.value, CloudError)
    proxy.denied_actions = {"DescribeInstances"}
    for act in (partial(cloud.terminate, job_id="ft-abc1"), cloud.stop_runner, cloud.interrupt_test):
        with pytest.raises(CloudError, match="UnauthorizedOperation"):
            await act(instance.instance_id)


async def test_interrupt_test_starts_an_fis_experiment_on_the_jobs_spot_instance(world: World, make_cloud: Any) -> None:
    cloud: AwsCloud = make_cloud()
    target = await cloud.launch(job_spec(cloud, "ft-drl1"), ["g5.xlarge"], "spot")
    bystander = await cloud.launch(job_spec(cloud, "ft-oth2"), ["g5.xlarge"], "spot")

    done = await cloud.interrupt_test(target.instance_id)
    assert (done.way, done.instance_id, done.after_seconds) == ("fis", target.instance_id, 120)
    experiment_id = done.reference
    experiment = world.fis.get_experiment(id=experiment_id)["experiment"]
    template = world.fis.get_experiment_template(id=experiment["experimentTemplateId"])["experimentTemplate"]
    assert template["tags"] == {"finetune:interrupt-test": "true", "finetune:job": "ft-drl1"}
    assert template["roleArn"] == FIS_ROLE
    assert template["stopConditions"] == [{"source": "none"}]
    (action,) = template["actions"].values()
    assert action["actionId"] == "aws:ec2:send-spot-instance-interruptions"
    assert action["parameters"] == {"durationBeforeInterruption": "PT2M"}
    (selector,) = template["targets"].values()
    assert selector["resourceType"] == "aws:ec2:spot-instance"
    assert selector["resourceTags"] == {"finetune:job": "ft-drl1"}
    assert selector["selectionMode"] == "ALL"

    # The interrupt test carried out again (a retried effect) is the same experiment, on the job's one template.
    again = await cloud.interrupt_test(target.instance_id)
    assert again.reference == experiment_id
    assert len(world.fis.list_experiment_templates()["experimentTemplates"]) == 1
    assert len(world.fis.list_experiments()["experiments"]) == 1

    # moto records the experiment but interrupts nothing: the test plays EC2's part, on the template's target.
    assert deliver_fis_interruption(world.ec2, world.fis, experiment_id) == [target.instance_id]
    assert world.instance(target.instance_id)["State"]["Name"] in ("shutting-down", "terminated")
    assert world.instance(bystander.instance_id)["State"]["Name"] == "running"


async def test_interrupt_test_refusals_say_what_to_fix(proxy: Ec2Proxy, make_cloud: Any) -> None:
    unset: AwsCloud = make_cloud(fis_role_arn=None)
    spot = await unset.launch(job_spec(unset), ["g5.xlarge"], "spot")
    with pytest.raises(CloudError, match="FIS is not set up: set fis_role_arn"):
        await unset.interrupt_test(spot.instance_id)

    cloud: AwsCloud = make_cloud()
    on_demand = await cloud.launch(job_spec(cloud, "ft-odm1"), ["g5.xlarge"], "on-demand")
    with pytest.raises(CloudError, match="on-demand: FIS interrupts only spot"):
        await cloud.interrupt_test(on_demand.instance_id)

    proxy.deny_fis = True
    with pytest.raises(CloudError, match="not permitted: FIS said AccessDeniedException"):
        await cloud.interrupt_test(spot.instance_id)


@pytest.fixture
def patched_moto(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """An in-process moto with one fix: moto 5.2.5 keeps the UserData of CreateLaunchTemplateVersion as a plain
    string, and Auto Scaling then fails (HTTP 500) launching from that version; AWS itself is fine. Only the
    Auto Scaling test, whose relaunch adds a template version, needs it."""
    from moto.core.types import Base64EncodedString
    from moto.ec2.models.launch_templates import LaunchTemplateVersion
    from moto.server import ThreadedMotoServer

    def user_data(version: Any) -> Any:
        value = version.data.get("UserData")
        return Base64EncodedString(value) if isinstance(value, str) else value

    monkeypatch.setattr(LaunchTemplateVersion, "user_data", property(user_data))
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=free_port(), verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{server._port}"
    reset_moto(endpoint)  # in-process moto keeps its state between servers: each test starts from nothing
    for name, value in AWS_TEST_ENV.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    yield endpoint
    server.stop()


async def test_autoscaling_group_per_job(patched_moto: str, open_clouds: list[AwsCloud]) -> None:
    world = build_world(patched_moto)
    keys = ReportKeys("master")
    cloud = AwsCloud(world.settings(mode="autoscaling"), report_keys=keys)
    open_clouds.append(cloud)
    first = await cloud.launch(job_spec(cloud), TYPES, "spot")
    # The group named its instance before the launch returned: its key object is there before its runner can ask.
    assert json.loads(world.object(world.key_object_of(first.instance_id)))["key"] == keys.of("ft-abc1", 1, SALT)

    (group,) = world.asg.describe_auto_scaling_groups(AutoScalingGroupNames=["finetune-ft-abc1"])["AutoScalingGroups"]
    assert (group["MinSize"], group["MaxSize"], group["DesiredCapacity"]) == (0, 1, 1)
    assert set(group["VPCZoneIdentifier"].split(",")) == set(world.subnets.values())
    policy = group["MixedInstancesPolicy"]
    assert [o["InstanceType"] for o in policy["LaunchTemplate"]["Overrides"]] == TYPES
    distribution = policy["InstancesDistribution"]
    assert distribution["OnDemandPercentageAboveBaseCapacity"] == 0
    assert distribution["SpotAllocationStrategy"] == "price-capacity-optimized"
    assert {t["Key"]: (t["Value"], t["PropagateAtLaunch"]) for t in group["Tags"]}["finetune:job"] == ("ft-abc1", True)
    assert [i["InstanceId"] for i in group["Instances"]] == [first.instance_id]
    # One group per job holds one instance: a switch of market stops first here; instance mode launches ahead.
    assert not launches_ahead(cloud) and launches_ahead(AwsCloud(world.settings(), report_keys=keys))
    # moto launches group instances as on-demand (no spot marking); the market is what the group asks for.
    assert first.market == "spot"
    tags = {tag["Key"]: tag["Value"] for tag in world.instance(first.instance_id)["Tags"]}
    assert (tags["finetune:job"], tags["finetune:attempt"]) == ("ft-abc1", "1")

    version = policy["LaunchTemplate"]["LaunchTemplateSpecification"]["Version"]
    data = world.ec2.describe_launch_template_versions(LaunchTemplateName="finetune-runner", Versions=[version])
    script = base64.b64decode(data["LaunchTemplateVersions"][0]["LaunchTemplateData"]["UserData"]).decode()
    assert "FINETUNE_SPEC=s3://ft-ckpt/jobs/ft-abc1/spec-attempt-1.json\n" in script
    options = data["LaunchTemplateVersions"][0]["LaunchTemplateData"]["MetadataOptions"]
    assert (options["HttpTokens"], options["HttpPutResponseHopLimit"]) == ("required", 1)
    spec = parse_spec(world.object("jobs/ft-abc1/spec-attempt-1.json"))
    assert spec.release is None  # the bot empties the group on completion: a runner's role may scale nothing

    await cloud.terminate(first.instance_id, "ft-abc1")
    (group,) = world.asg.describe_auto_scaling_groups(AutoScalingGroupNames=["finetune-ft-abc1"])["AutoScalingGroups"]
    assert group["DesiredCapacity"] == 0
    assert world.keys_under("attempt-keys/") == []
    assert world.instance(first.instance_id)["State"]["Name"] in ("shutting-down", "terminated")

    # The next attempt reuses the group with a new template version and gets a new instance.
    second = await cloud.launch(job_spec(cloud, attempt=2), TYPES, "spot")
    assert second.instance_id != first.instance_id
    (group,) = world.asg.describe_auto_scaling_groups(AutoScalingGroupNames=["finetune-ft-abc1"])["AutoScalingGroups"]
    assert group["DesiredCapacity"] == 1
    assert int(group["MixedInstancesPolicy"]["LaunchTemplate"]["LaunchTemplateSpecification"]["Version"]) > int(version)
    assert "spec-attempt-2.json" in world.user_data(second.instance_id)
    tags = {tag["Key"]: tag["Value"] for tag in world.instance(second.instance_id)["Tags"]}
    assert tags["finetune:attempt"] == "2"
    assert world.keys_under("attempt-keys/") == [world.key_object_of(second.instance_id)]
    await cloud.stop_runner(second.instance_id)
    assert json.loads(world.object("jobs/ft-abc1/control/attempt-2.json")) == {"type": "stop"}


async def test_hourly_price_for_the_spend_guard(proxy: Ec2Proxy, make_cloud: Any) -> None:
    proxy.spot_prices = {("us-east-1a", "g5.xlarge"): 0.52, ("us-east-1b", "g6.xlarge"): 0.41}
    cloud: AwsCloud = make_cloud()
    assert await cloud.hourly_price(["g5.xlarge", "g6.xlarge"], "spot") == pytest.approx(0.41)
    assert await cloud.hourly_price(["g5.xlarge", "g6.xlarge"], "on-demand") == pytest.approx(0.805)
    assert await cloud.hourly_price(["x9.unknown"], "on-demand") is None


async def test_list_instances_finds_the_tagged_instances_for_reconciliation(world: World, make_cloud: Any) -> None:
    from handlers.reconcile import CloudInstance

    cloud: AwsCloud = make_cloud()
    first = await cloud.launch(job_spec(cloud, "ft-lst1", attempt=1), ["g5.xlarge"], "spot")
    second = await cloud.launch(job_spec(cloud, "ft-lst1", attempt=2), ["g5.xlarge"], "spot")
    other = await cloud.launch(job_spec(cloud, "ft-lst2", attempt=3), ["g5.xlarge"], "on-demand")
    await cloud.terminate(first.instance_id, "ft-lst1")
    world.ec2.run_instances(ImageId=world.image_id, MinCount=1, MaxCount=1, InstanceType="t3.micro")  # untagged

    listed = {i.instance_id: i for i in await cloud.list_instances() if i.job_id in ("ft-lst1", "ft-lst2")}
    assert set(listed) == {first.instance_id, second.instance_id, other.instance_id}
    assert all(isinstance(i, CloudInstance) and i.launched_at is not None for i in listed.values())
    assert (listed[second.instance_id].job_id, listed[second.instance_id].attempt) == ("ft-lst1", 2)
    assert listed[second.instance_id].live and listed[other.instance_id].attempt == 3
    assert not listed[first.instance_id].live and listed[first.instance_id].state in ("shutting-down", "terminated")
    assert all(i.job_id is not None for i in await cloud.list_instances())  # the untagged one is not listed


async def test_reconcile_on_moto_releases_the_orphans_by_tag_and_leaves_the_running_job_alone(
    world: World, make_cloud: Any, redis_client: Any, key_prefix: str
) -> None:
    """The reconcile loop against EC2's real wire protocol: list by ``finetune:job``, terminate the instances of a
    job that is over and of one the bot does not know (through the cloud executor), keep the running job's."""
    cloud: AwsCloud = make_cloud()
    store = JobStore(redis_client, Keys(key_prefix))
    over = await cloud.launch(job_spec(cloud, "ft-over1", attempt=1), ["g5.xlarge"], "spot")
    unknown = await cloud.launch(job_spec(cloud, "ft-zz99", attempt=1), ["g5.xlarge"], "spot")
    running = await cloud.launch(job_spec(cloud, "ft-run1", attempt=1), ["g5.xlarge"], "spot")
    now = datetime.now(UTC)
    for job_id, state, instance in (("ft-over1", JobState.SUCCEEDED, over), ("ft-run1", JobState.RUNNING, running)):
        attempt = Attempt(number=1, instance_id=instance.instance_id, launched_at=now)
        job = Job(id=job_id, recipe="tiny", requested_by="console:ana", state=state, attempts=[attempt], updated_at=now)
        assert await store.create(job, {"event": "created"})

    done = await Reconciler(redis_client, store, cloud, Lifecycle()).round(now)
    assert done is not None
    assert sorted((d.action.action, d.action.instance_id, d.action.code, d.acted) for d in done) == sorted(
        [("release", over.instance_id, "job-over", True), ("release", unknown.instance_id, "job-unknown", True)]
    )
    stop = asyncio.Event()
    effects = CloudEffects(redis_client, store, cloud, dict(BUILT_IN), [])
    task = asyncio.create_task(effects.run(stop))
    try:
        for _ in range(600):
            states = {i: world.instance(i)["State"]["Name"] for i in (over.instance_id, unknown.instance_id)}
            if all(state in ("shutting-down", "terminated") for state in states.values()):
                break
            await asyncio.sleep(0.05)
        assert all(state in ("shutting-down", "terminated") for state in states.values()), states
    finally:
        stop.set()
        await task
    assert world.instance(running.instance_id)["State"]["Name"] == "running"
    notes = [json.loads(fields["event"]) for _, fields in await redis_client.xrange(Keys(key_prefix).chat)]
    released = [entry["note"] for entry in notes if entry["note"]["note"]["type"] == "instance-released"]
    assert [(note["job_id"], note["note"]["instance"]) for note in released] == [("ft-over1", over.instance_id)]


async def test_reconcile_sets_the_auto_scaling_group_of_an_ended_job_to_zero(
    patched_moto: str, open_clouds: list[AwsCloud], redis_client: Any, key_prefix: str
) -> None:
    world = build_world(patched_moto)
    cloud = AwsCloud(world.settings(mode="autoscaling"))
    open_clouds.append(cloud)
    store = JobStore(redis_client, Keys(key_prefix))
    now = datetime.now(UTC)
    for job_id, state in (("ft-grp1", JobState.STOPPED), ("ft-grp2", JobState.RUNNING)):
        instance = await cloud.launch(job_spec(cloud, job_id), TYPES, "spot")
        attempt = Attempt(number=1, instance_id=instance.instance_id, launched_at=now)
        job = Job(id=job_id, recipe="tiny", requested_by="console:ana", state=state, attempts=[attempt], updated_at=now)
        assert await store.create(job, {"event": "created"})
    listed = {group.name: group for group in await cloud.list_groups()}
    assert (listed["finetune-ft-grp1"].job_id, listed["finetune-ft-grp1"].desired) == ("ft-grp1", 1)

    reconciler = Reconciler(redis_client, store, cloud, Lifecycle())
    done = await reconciler.round(now)
    assert done is not None
    groups = [(d.action.group, d.action.code, d.acted) for d in done if d.action.action == "release-group"]
    assert groups == [("finetune-ft-grp1", "job-over", True)]

    def desired(name: str) -> int:
        (group,) = world.asg.describe_auto_scaling_groups(AutoScalingGroupNames=[name])["AutoScalingGroups"]
        return int(group["DesiredCapacity"])

    assert (desired("finetune-ft-grp1"), desired("finetune-ft-grp2")) == (0, 1)  # the running job keeps its group
    notes = [json.loads(fields["event"])["note"] for _, fields in await redis_client.xrange(Keys(key_prefix).chat)]
    assert [(n["job_id"], n["note"]["group"]) for n in notes if n["note"]["type"] == "group-released"] == [
        ("ft-grp1", "finetune-ft-grp1")
    ]
    again = await reconciler.round(now)  # at 0 now: nothing more to do for the group
    assert again is not None and [d for d in again if d.action.action == "release-group"] == []
    await cloud.release_group("finetune-no-such-group")  # a group that is gone is fine


@pytest.fixture
def sold_out_groups(patched_moto: str, monkeypatch: pytest.MonkeyPatch) -> set[str]:
    """Zones whose spot capacity is gone, for Auto Scaling groups on moto: a spot group whose (first) subnet is in
    one launches nothing and says why in its scaling activity, as AWS does (moto launches every group instance, in
    the group's first subnet, and keeps no activities)."""
    from moto.autoscaling.models import FakeAutoScalingGroup
    from moto.autoscaling.responses import AutoScalingResponse
    from moto.core.responses import ActionResult
    from moto.ec2.models import ec2_backends

    sold_out: set[str] = set()
    activities: dict[str, list[dict[str, Any]]] = {}
    launch = FakeAutoScalingGroup.replace_autoscaling_group_instances

    def replace(group: Any, count_needed: int, propagated_tags: dict[str, str]) -> None:
        subnet = group.vpc_zone_identifier.split(",")[0]
        zone = ec2_backends[group.account_id][group.region].get_subnet(subnet).availability_zone
        distribution = (group.mixed_instances_policy or {}).get("InstancesDistribution", {})
        spot = int(distribution.get("OnDemandPercentageAboveBaseCapacity", 100)) == 0
        if spot and zone in sold_out:
            message = f"Could not launch Spot Instances. InsufficientInstanceCapacity - no Spot capacity in {zone}."
            activity = {
                "ActivityId": f"act-{len(activities)}",
                "AutoScalingGroupName": group.name,
                "Cause": "an instance was started in response to a difference between desired and actual capacity",
                "StartTime": datetime.now(UTC),
                "StatusCode": "Failed",
                "StatusMessage": message,
            }
            activities.setdefault(group.name, []).insert(0, activity)
            return
        launch(group, count_needed, propagated_tags)

    def describe(response: Any) -> ActionResult:
        return ActionResult({"Activities": activities.get(response._get_param("AutoScalingGroupName"), [])})

    monkeypatch.setattr(FakeAutoScalingGroup, "replace_autoscaling_group_instances", replace)
    monkeypatch.setattr(AutoScalingResponse, "describe_scaling_activities", describe)
    return sold_out


async def test_in_auto_scaling_mode_only_the_spot_authority_chooses_zone_and_market(
    patched_moto: str, sold_out_groups: set[str], open_clouds: list[AwsCloud]
) -> None:
    """A capacity refusal, an interruption and a resume go through handlers/spot/ and nothing else: each launch's
    (market, zone) is the decision's, the group is told exactly that (the chosen zone's subnet alone, all of it on
    the chosen market), and what runs is what was decided; a provider that changed market by itself fails here."""
    world = build_world(patched_moto)
    cloud = AwsCloud(world.settings(mode="autoscaling", group_wait_seconds=1))
    open_clouds.append(cloud)
    view = SpotView(zones=tuple(ZONES), spot_price=0.3, on_demand_price=1.0)
    limits = Lifecycle(relaunch_pause_seconds=0, max_relaunches_without_progress=10)
    now = datetime(2026, 3, 2, 8, 30, tzinfo=UTC)
    decided: list[tuple[str, str | None]] = []

    async def carry_out(change: Change) -> Launched | LaunchFailed:
        """The cloud executor's part, on the real provider: launch exactly what the decision chose."""
        (launch,) = [effect for effect in dumped(change) if effect["type"] == "launch"]
        market, zone, attempt = launch["market"], launch["zone"], launch["attempt"]
        chosen = (change.history["policy"], change.history["policy_zone"] or None)
        assert (market, zone) == chosen  # the launch is the decision's choice, nothing else
        decided.append((market, zone))
        try:
            instance = await cloud.launch(job_spec(cloud, attempt=attempt), TYPES, market, zone=zone)
        except LaunchError as exc:
            return LaunchFailed(job_id="ft-abc1", attempt=attempt, reason=str(exc), capacity=exc.capacity, zone=zone)
        (group,) = world.asg.describe_auto_scaling_groups(AutoScalingGroupNames=["finetune-ft-abc1"])[
            "AutoScalingGroups"
        ]
        distribution = group["MixedInstancesPolicy"]["InstancesDistribution"]
        assert {key: distribution[key] for key in group_distribution(market)} == group_distribution(market)
        if zone is not None:
            assert group["VPCZoneIdentifier"] == world.subnets[zone]
        assert instance.market == market and (zone is None or instance.zone == zone)
        return Launched(
            job_id="ft-abc1",
            attempt=attempt,
            instance_id=instance.instance_id,
            instance_type=instance.instance_type,
            zone=instance.zone,
            market=instance.market,
        )

    def running(change: Change) -> Change:
        """The runner on the new instance reports its start."""
        started = Started(job_id="ft-abc1", attempt=change.job.attempt, time=now)
        return decide(change.job, ReportReceived(report=started), now, lifecycle=limits, spot=view)

    # The first launch: spot in the first zone, which has no spot now; the refusal goes back to the decision.
    sold_out_groups.add("us-east-1a")
    change = new_job("ft-abc1", "tiny", {}, "console:ana", None, now, 200, spot_policy="spot-first", spot=view)
    result = await carry_out(change)
    assert isinstance(result, LaunchFailed) and result.capacity and "InsufficientInstanceCapacity" in result.reason
    change = decide(change.job, result, now, lifecycle=limits, spot=view)
    result = await carry_out(change)
    assert isinstance(result, Launched)
    change = running(decide(change.job, result, now, lifecycle=limits, spot=view))

    # The spot instance is reclaimed: the decision moves to the zone that still has spot.
    sold_out_groups.add("us-east-1b")
    gone = CloudEvent(kind="instance-gone", instance_id=result.instance_id, source="aws.ec2", detail="spot reclaimed")
    change = decide(change.job, gone, now, lifecycle=limits, spot=view)
    result = await carry_out(change)
    assert isinstance(result, Launched)
    change = running(decide(change.job, result, now, lifecycle=limits, spot=view))

    # Reclaimed again, and no zone has spot left: on-demand, because the decision says so.
    sold_out_groups.add("us-east-1c")
    gone = CloudEvent(kind="instance-gone", instance_id=result.instance_id, source="aws.ec2", detail="spot reclaimed")
    change = decide(change.job, gone, now, lifecycle=limits, spot=view)
    result = await carry_out(change)
    assert isinstance(result, Launched) and result.market == "on-demand"
    change = running(decide(change.job, result, now, lifecycle=limits, spot=view))

    # Stopped, then resumed once spot is back: the decision returns to spot, in the first zone again.
    change = stop_command(change.job, "console:ana", now, limits)
    change = decide(change.job, StopDeadline(job_id="ft-abc1", attempt=change.job.attempt, due=now), now)
    assert change.job.state is JobState.STOPPED
    sold_out_groups.clear()
    later = now + timedelta(minutes=31)  # past the cool-down of the refused and reclaimed zones
    change = resume_command(change.job, "console:ana", False, later, view)
    result = await carry_out(change)
    assert isinstance(result, Launched)

    assert decided == [
        ("spot", "us-east-1a"),
        ("spot", "us-east-1b"),
        ("spot", "us-east-1c"),
        ("on-demand", None),
        ("spot", "us-east-1a"),
    ]


async def test_placement_scores_are_cached_per_instance_types_and_weighed_as_availability(
    proxy: Ec2Proxy, make_cloud: Any
) -> None:
    proxy.placement_scores = {ZONE_IDS["us-east-1a"]: 9, ZONE_IDS["us-east-1b"]: 3}
    cloud: AwsCloud = make_cloud()
    assert await cloud.zone_availability(TYPES) == {"us-east-1a": 0.9, "us-east-1b": 0.3}
    await cloud.zone_availability(list(reversed(TYPES)))  # the same types: the cached answer
    await cloud.launch(job_spec(cloud), TYPES, "spot")
    assert len(proxy.actions("GetSpotPlacementScores")) == 1
    await cloud.zone_availability(["g5.xlarge"])  # other types: asked
    assert len(proxy.actions("GetSpotPlacementScores")) == 2
    # A gang's: scored for all its nodes in one zone, asked apart from (and cached apart from) one instance's.
    await cloud.zone_availability(TYPES, nodes=4)
    await cloud.zone_availability(TYPES, nodes=4)
    asked = proxy.actions("GetSpotPlacementScores")
    assert [form["TargetCapacity"] for form in asked] == ["1", "1", "4"]


async def test_without_placement_scores_there_is_no_signal(proxy: Ec2Proxy, make_cloud: Any) -> None:
    cloud: AwsCloud = make_cloud()  # moto has no GetSpotPlacementScores: the proxy passes its error on
    assert await cloud.zone_availability(TYPES) == {}


async def test_the_attempts_report_key_lies_in_an_object_only_its_instance_may_read_until_release(
    world: World, proxy: Ec2Proxy, open_clouds: list[AwsCloud]
) -> None:
    """Not in the spec (every runner reads every spec), not in user data (every process on the instance reads that):
    in attempt-keys/<runner role id>:<instance id>, tagged for that one reader, and gone once the instance is."""
    keys = ReportKeys("the-bots-master-report-secret")
    topic = "arn:aws:sns:us-east-1:123456789012:finetune-reports"
    cloud = AwsCloud(world.settings(report_topic_arn=topic), report_keys=keys)
    open_clouds.append(cloud)
    instance = await cloud.launch(job_spec(cloud, attempt=2), ["g5.xlarge"], "spot")
    key = keys.of("ft-abc1", 2, SALT)
    raw_spec = world.object("jobs/ft-abc1/spec-attempt-2.json")
    spec = parse_spec(raw_spec)
    assert key.encode() not in raw_spec and spec.report == [f"sns:{topic}"]
    assert spec.report_key_from == f"s3://{BUCKET}/attempt-keys/{RUNNER_ROLE_ID}:"
    name = world.key_object_of(instance.instance_id)
    assert json.loads(world.object(name)) == {"job_id": "ft-abc1", "attempt": 2, "key": key}
    tags = world.s3.get_object_tagging(Bucket=BUCKET, Key=name)["TagSet"]
    assert tags == [{"Key": "finetune:reader", "Value": f"{RUNNER_ROLE_ID}:{instance.instance_id}"}]
    user_data = world.user_data(instance.instance_id)
    assert key not in user_data and keys.master not in user_data and "REPORT" not in user_data

    await cloud.terminate(instance.instance_id, "ft-abc1")
    assert world.keys_under("attempt-keys/") == []
    await cloud.terminate(instance.instance_id, "ft-abc1")  # again: nothing to delete, no error


async def test_a_launch_retried_after_a_crash_writes_the_key_again(
    world: World, proxy: Ec2Proxy, open_clouds: list[AwsCloud]
) -> None:
    cloud = AwsCloud(world.settings(), report_keys=ReportKeys("master"))
    open_clouds.append(cloud)
    first = await cloud.launch(job_spec(cloud), ["g5.xlarge"], "spot")
    world.s3.delete_object(Bucket=BUCKET, Key=world.key_object_of(first.instance_id))  # lost with the crash
    again = await cloud.launch(job_spec(cloud), ["g5.xlarge"], "spot")
    assert again.instance_id == first.instance_id
    assert json.loads(world.object(world.key_object_of(first.instance_id)))["attempt"] == 1


async def test_a_key_the_bot_may_not_write_fails_the_launch_and_releases_its_instance(
    world: World, proxy: Ec2Proxy, open_clouds: list[AwsCloud], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bot on a runner stack older than its key grant: the instance's runner could never report, so it goes."""
    s3 = await S3FaultProxy(world.endpoint).start()
    try:
        monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3.endpoint)
        s3.refuse = lambda method, path: method == "PUT" and "/attempt-keys/" in path
        cloud = AwsCloud(world.settings(), report_keys=ReportKeys("master"))
        open_clouds.append(cloud)
        with pytest.raises(LaunchError, match="could not write the report key of ft-abc1 attempt 1") as refused:
            await cloud.launch(job_spec(cloud), ["g5.xlarge"], "spot")
        assert "AccessDenied" in str(refused.value) and "the instance was released" in str(refused.value)
        assert not refused.value.capacity  # not the market's fault: the spot authority is not asked to move
        (launched,) = [i for r in world.ec2.describe_instances()["Reservations"] for i in r["Instances"]]
        assert launched["State"]["Name"] in ("shutting-down", "terminated")
    finally:
        await s3.stop()


async def test_report_keys_without_the_runner_role_id_is_a_config_error(world: World) -> None:
    with pytest.raises(ConfigError, match=r"aws\.runner_role_id is not set"):
        AwsCloud(world.settings(runner_role_id=None), report_keys=ReportKeys("master"))
    with pytest.raises(ValidationError, match="runner_role_id"):
        world.settings(runner_role_id="arn:aws:iam::123456789012:role/finetune-runner")  # the ARN is not the id

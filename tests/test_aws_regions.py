"""AwsCloud across two regions on moto (server mode), with the EC2 proxy of tests/aws_fakes.py answering what moto
cannot: spot refused for capacity in the home region (InsufficientInstanceCapacity, as EC2 answers it), and spot
placement scores across regions (one GetSpotPlacementScores call naming both) favouring the other region.

The home region us-east-1 holds the bucket; us-west-2 has its own VPC, subnets, security group, image and runner role.
moto keeps each region's EC2 (and SQS, EventBridge) apart by the region a request is signed for, as AWS does.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import boto3
import pytest
from pydantic import ValidationError

from bot.chat.render import card_text
from bot.cloud.aws.provider import AwsCloud
from bot.cloud.aws.settings import AwsSettings
from bot.cloud.base import LaunchError, SetupScope, SpansRegions
from bot.errors import ConfigError
from bot.settings import parse_file_config
from fakes.bot_harness import SECRET, eventually, running_bot, settled, start_job, wait_job
from handlers.change import Change
from handlers.decide import decide, new_job
from handlers.jobs import JobState
from handlers.messages import Launched, LaunchFailed
from handlers.regions import AWS_TRANSFER_PRICE_PER_GB
from handlers.report_keys import ReportKeys
from handlers.spot import SpotView
from tests.aws_fakes import REGION_FORM_KEY, Ec2Proxy, spot_request
from tests.outboxes import dumped
from tests.test_aws_cloud import BUCKET, SALT, World, build_world, job_spec, patched_moto  # noqa: F401 (fixture)
from tests.test_aws_scenario import Ec2Bodies
from tests.test_bot_scenarios import wait_for_text

HOME, OTHER = "us-east-1", "us-west-2"
HOME_ZONES = ["us-east-1a", "us-east-1b"]
OTHER_ZONES = ["us-west-2a", "us-west-2b"]
HOME_ROLE, OTHER_ROLE = "AROAHOMERUNNERROLE", "AROAWESTRUNNERROLE"  # each region's runner stack has its own role
TYPES = ["g5.xlarge", "g6.xlarge"]
DEAD_IMAGE = "ami-0000000000000dead"


@dataclass
class Region:
    """One launch region as moto holds it: its EC2 client and what a launch there needs."""

    name: str
    ec2: Any
    subnets: dict[str, str]
    security_group: str
    image_id: str
    zone_ids: dict[str, str]  # zone name -> zone id (placement scores speak ids)

    def launch_settings(self, role: str) -> dict[str, Any]:
        return {
            "subnets": self.subnets,
            "zones": list(self.subnets),
            "security_group_ids": [self.security_group],
            "image_id": self.image_id,
            "instance_profile": "finetune-runner",
            "runner_role_id": role,
        }

    def instance(self, instance_id: str) -> dict[str, Any]:
        return dict(self.ec2.describe_instances(InstanceIds=[instance_id])["Reservations"][0]["Instances"][0])

    def user_data(self, instance_id: str) -> str:
        value = self.ec2.describe_instance_attribute(InstanceId=instance_id, Attribute="userData")["UserData"]["Value"]
        return base64.b64decode(value).decode()


def region_of_moto(endpoint: str, name: str, zones: list[str], home: World | None = None) -> Region:
    ec2 = boto3.client("ec2", endpoint_url=endpoint, region_name=name)
    if home is not None:
        subnets = {zone: home.subnets[zone] for zone in zones}
        group, image = home.security_group, home.image_id
    else:
        vpc = ec2.create_vpc(CidrBlock="10.1.0.0/16")["Vpc"]["VpcId"]
        subnets = {
            zone: ec2.create_subnet(VpcId=vpc, CidrBlock=f"10.1.{i}.0/24", AvailabilityZone=zone)["Subnet"]["SubnetId"]
            for i, zone in enumerate(zones)
        }
        group = ec2.create_security_group(GroupName="finetune", Description="runner", VpcId=vpc)["GroupId"]
        images = ec2.describe_images(Owners=["amazon"], Filters=[{"Name": "name", "Values": ["amzn2-ami-hvm-*"]}])
        image = images["Images"][0]["ImageId"]
    described = ec2.describe_availability_zones()["AvailabilityZones"]
    zone_ids = {str(zone["ZoneName"]): str(zone["ZoneId"]) for zone in described}
    return Region(name, ec2, subnets, group, image, zone_ids)


@dataclass
class TwoRegions:
    world: World  # the home region's bucket and S3 client
    home: Region
    other: Region

    def settings(self, **changes: Any) -> AwsSettings:
        values: dict[str, Any] = {
            "bucket": BUCKET,
            "region": HOME,
            "fis_role_arn": "arn:aws:iam::123456789012:role/finetune-fis",
            "regions": {
                HOME: self.home.launch_settings(HOME_ROLE),
                OTHER: self.other.launch_settings(OTHER_ROLE),
            },
        }
        values.update(changes)
        return AwsSettings(**values)

    def region(self, zone: str) -> Region:
        return self.home if zone.startswith(HOME) else self.other


def two_regions(endpoint: str) -> TwoRegions:
    world = build_world(endpoint)  # bucket, VPC, subnets in us-east-1a/b/c, security group, instance profile, image
    home, other = region_of_moto(endpoint, HOME, HOME_ZONES, world), region_of_moto(endpoint, OTHER, OTHER_ZONES)
    return TwoRegions(world, home, other)


@pytest.fixture
def regions(aws: str) -> TwoRegions:
    return two_regions(aws)


@pytest.fixture
async def proxy(regions: TwoRegions, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Ec2Proxy]:
    """Every EC2 call of the provider, whichever region it is signed for, goes through the proxy."""
    started = await Ec2Proxy(regions.world.endpoint).start()
    monkeypatch.setenv("AWS_ENDPOINT_URL_EC2", started.endpoint)
    monkeypatch.setenv("AWS_ENDPOINT_URL_FIS", started.endpoint)
    yield started
    await started.stop()


@pytest.fixture
async def open_clouds() -> AsyncIterator[list[AwsCloud]]:
    clouds: list[AwsCloud] = []
    yield clouds
    for cloud in clouds:
        await cloud.close()


def no_spot_at_home(form: dict[str, str]) -> str | None:
    """EC2 in the home region has no spot room; the other region has."""
    return "InsufficientInstanceCapacity" if spot_request(form) and form[REGION_FORM_KEY] == HOME else None


def scores_favouring_the_other_region(regions: TwoRegions) -> dict[str, dict[str, int]]:
    return {
        HOME: {regions.home.zone_ids[zone]: 2 for zone in HOME_ZONES},
        OTHER: {regions.other.zone_ids["us-west-2a"]: 9, regions.other.zone_ids["us-west-2b"]: 6},
    }


async def test_a_home_region_without_spot_room_hands_the_launch_to_the_other_region_within_the_attempt(
    regions: TwoRegions, proxy: Ec2Proxy, open_clouds: list[AwsCloud]
) -> None:
    """No placement scores (moto has none): the home region's zones come first and refuse spot for capacity; after
    max_launch_failures of them the same launch moves to us-west-2, where the instance starts, tagged with the job and
    attempt, its runner told the bucket's region and its own region's key objects."""
    proxy.run_instances_fault = no_spot_at_home
    keys = ReportKeys("the-bots-master-report-secret")
    cloud = AwsCloud(regions.settings(max_launch_failures=3), report_keys=keys)
    open_clouds.append(cloud)

    instance = await cloud.launch(job_spec(cloud, attempt=2), TYPES, "spot")

    tried = [(form[REGION_FORM_KEY], form["Placement.AvailabilityZone"]) for form in proxy.actions("RunInstances")]
    assert [region for region, _ in tried] == [HOME, HOME, HOME, OTHER]  # the fourth home candidate was skipped
    assert instance.zone in OTHER_ZONES and instance.market == "spot" and tried[-1][1] == instance.zone
    described = regions.other.instance(instance.instance_id)
    assert described["InstanceLifecycle"] == "spot"
    assert described["Placement"]["AvailabilityZone"] == instance.zone
    assert described["SubnetId"] == regions.other.subnets[instance.zone]
    assert described["ImageId"] == regions.other.image_id
    tags = {tag["Key"]: tag["Value"] for tag in described["Tags"]}
    assert (tags["finetune:job"], tags["finetune:attempt"]) == ("ft-abc1", "2")
    # The runner reaches the bucket in the home region, and reads its key object named after us-west-2's runner role.
    user_data = regions.other.user_data(instance.instance_id)
    assert re.search(rf"\bAWS_REGION={HOME}\b", user_data) and OTHER not in user_data
    assert f"FINETUNE_KEY_FROM=s3://{BUCKET}/attempt-keys/{OTHER_ROLE}:" in user_data
    key_object = f"attempt-keys/{OTHER_ROLE}:{instance.instance_id}"
    assert regions.world.keys_under("attempt-keys/") == [key_object]
    # The runner roles differ, so the spec names no key prefix: each runner's user data says its own.
    assert b'"report_key_from":null' in regions.world.object("jobs/ft-abc1/spec-attempt-2.json")
    assert keys.of("ft-abc1", 2, SALT).encode() in regions.world.object(key_object)

    # A bot that did not launch it (restarted) finds the instance's region by asking each region.
    again, lister = AwsCloud(regions.settings(), report_keys=keys), AwsCloud(regions.settings())
    open_clouds.extend([again, lister])
    listed = {item.instance_id: item for item in await lister.list_instances()}
    assert (listed[instance.instance_id].job_id, listed[instance.instance_id].attempt) == ("ft-abc1", 2)
    await again.stop_runner(instance.instance_id)
    assert regions.world.object("jobs/ft-abc1/control/attempt-2.json")
    tested = await again.interrupt_test(instance.instance_id)  # FIS in the instance's region
    experiments = {
        name: boto3.client("fis", endpoint_url=regions.world.endpoint, region_name=name).list_experiments()
        for name in (HOME, OTHER)
    }
    assert [item["id"] for item in experiments[OTHER]["experiments"]] == [tested.reference]
    assert experiments[HOME]["experiments"] == []
    await again.terminate(instance.instance_id, "ft-abc1")
    assert regions.other.instance(instance.instance_id)["State"]["Name"] in ("shutting-down", "terminated")
    assert regions.world.keys_under("attempt-keys/") == []


async def test_every_region_refusing_is_one_capacity_refusal_naming_the_zones_tried(
    regions: TwoRegions, proxy: Ec2Proxy, open_clouds: list[AwsCloud]
) -> None:
    proxy.run_instances_fault = lambda form: "InsufficientInstanceCapacity" if spot_request(form) else None
    cloud = AwsCloud(regions.settings(max_launch_failures=2))
    open_clouds.append(cloud)
    with pytest.raises(LaunchError) as refused:
        await cloud.launch(job_spec(cloud), TYPES, "spot")
    assert refused.value.capacity
    tried = [(form[REGION_FORM_KEY], form["Placement.AvailabilityZone"]) for form in proxy.actions("RunInstances")]
    assert [region for region, _ in tried] == [HOME, HOME, OTHER, OTHER]  # two per region, then no region is left
    assert list(refused.value.refused_zones) == list(dict.fromkeys(zone for _, zone in tried))
    assert all(zone in str(refused.value) for _, zone in tried)


async def test_zones_scores_and_prices_span_the_regions_in_one_placement_score_call(
    regions: TwoRegions, proxy: Ec2Proxy, open_clouds: list[AwsCloud]
) -> None:
    proxy.regional_placement_scores = scores_favouring_the_other_region(regions)
    proxy.spot_prices = {("us-east-1a", "g5.xlarge"): 0.40, ("us-west-2b", "g5.xlarge"): 0.31}
    cloud = AwsCloud(regions.settings(transfer_price_per_gb=0.03))
    open_clouds.append(cloud)
    assert isinstance(cloud, SpansRegions)
    assert (cloud.home_region, cloud.transfer_price_per_gb) == (HOME, 0.03)
    assert await cloud.spot_zones(TYPES) == HOME_ZONES + OTHER_ZONES  # the home region's first
    assert await cloud.zone_availability(TYPES) == {
        "us-east-1a": 0.2,
        "us-east-1b": 0.2,
        "us-west-2a": 0.9,
        "us-west-2b": 0.6,
    }
    await cloud.zone_availability(TYPES)  # cached
    [asked] = proxy.actions("GetSpotPlacementScores")
    assert [asked["RegionName.1"], asked["RegionName.2"]] == [HOME, OTHER]
    assert asked["SingleAvailabilityZone"] == "true"
    assert await cloud.hourly_price(["g5.xlarge"], "spot") == 0.31  # the other region's price counts too
    # Scores rank us-west-2a first, though the home region comes first in the configured order.
    instance = await cloud.launch(job_spec(cloud), TYPES, "spot")
    assert instance.zone == "us-west-2a"
    # Pinned by the spot authority to a zone of the other region: launched there.
    pinned = await cloud.launch(job_spec(cloud, attempt=2), TYPES, "spot", zone="us-west-2b")
    assert pinned.zone == "us-west-2b"
    assert regions.other.instance(pinned.instance_id)["Placement"]["AvailabilityZone"] == "us-west-2b"


async def test_a_region_whose_zones_cannot_be_listed_is_left_out_not_the_launch(
    regions: TwoRegions, proxy: Ec2Proxy, open_clouds: list[AwsCloud]
) -> None:
    broken = regions.settings().regions[OTHER].model_copy(update={"subnets": ["subnet-0000000000gone"]})
    cloud = AwsCloud(regions.settings(regions={**regions.settings().regions, OTHER: broken}))
    open_clouds.append(cloud)
    assert await cloud.spot_zones(TYPES) == HOME_ZONES
    instance = await cloud.launch(job_spec(cloud), TYPES, "spot")
    assert instance.zone in HOME_ZONES


async def test_the_spot_authority_places_the_job_in_the_region_with_room_and_the_card_names_its_zone(
    regions: TwoRegions, proxy: Ec2Proxy, open_clouds: list[AwsCloud]
) -> None:
    """The bot's path without its processes: the spot authority decides over the provider's view (every region's
    zones, the one placement score call, prices), the provider carries out each launch exactly as decided, and a
    capacity refusal goes back to the authority; the job ends up on spot in us-west-2, and the card says where."""
    proxy.run_instances_fault = no_spot_at_home
    proxy.regional_placement_scores = scores_favouring_the_other_region(regions)
    cloud = AwsCloud(regions.settings())
    open_clouds.append(cloud)
    view = SpotView(
        zones=tuple(await cloud.spot_zones(TYPES)),
        spot_price=await cloud.hourly_price(TYPES, "spot"),
        on_demand_price=await cloud.hourly_price(TYPES, "on-demand"),
        scores=await cloud.zone_availability(TYPES),
    )
    now = datetime(2026, 12, 7, 22, 0, tzinfo=UTC)

    async def carry_out(change: Change) -> Launched | LaunchFailed:
        (launch,) = [effect for effect in dumped(change) if effect["type"] == "launch"]
        market, zone, attempt = launch["market"], launch["zone"], launch["attempt"]
        try:
            instance = await cloud.launch(job_spec(cloud, "ft-west", attempt), TYPES, market, zone=zone)
        except LaunchError as exc:
            return LaunchFailed(job_id="ft-west", attempt=attempt, reason=str(exc), capacity=exc.capacity, zone=zone)
        return Launched(
            job_id="ft-west",
            attempt=attempt,
            instance_id=instance.instance_id,
            instance_type=instance.instance_type,
            zone=instance.zone,
            market=instance.market,
        )

    change = new_job("ft-west", "tiny", {}, "console:ana", None, now, 200, spot_policy="spot-first", spot=view)
    for _ in range(len(view.zones) + 1):  # each refusal goes back to the authority; never more than every zone
        result = await carry_out(change)
        change = decide(change.job, result, now, spot=view)
        if isinstance(result, Launched):
            break
    assert isinstance(result, Launched)
    assert result.market == "spot" and result.zone in OTHER_ZONES
    described = regions.other.instance(result.instance_id)
    tags = {tag["Key"]: tag["Value"] for tag in described["Tags"]}
    assert (tags["finetune:job"], tags["finetune:attempt"]) == ("ft-west", str(result.attempt))
    assert change.job.current is not None and change.job.current.zone == result.zone
    assert result.zone in card_text(change.job, now)  # the card names the zone, and so the region


@pytest.mark.usefixtures("patched_moto")
async def test_in_auto_scaling_mode_the_jobs_group_follows_the_chosen_zone_to_its_region(
    open_clouds: list[AwsCloud],
) -> None:
    """The job's group is made in the pinned zone's region; a relaunch in the other region sets the group it left to
    0 first, so that group does not replace its instance beside the new one."""
    endpoint = os.environ["AWS_ENDPOINT_URL"]  # the in-process moto patched_moto started
    regions = two_regions(endpoint)
    cloud = AwsCloud(regions.settings(mode="autoscaling", group_poll_seconds=0.2, group_wait_seconds=10))
    open_clouds.append(cloud)
    west = boto3.client("autoscaling", endpoint_url=endpoint, region_name=OTHER)
    first = await cloud.launch(job_spec(cloud), TYPES, "spot", zone="us-west-2b")
    assert first.zone == "us-west-2b"
    (group,) = west.describe_auto_scaling_groups(AutoScalingGroupNames=["finetune-ft-abc1"])["AutoScalingGroups"]
    assert group["VPCZoneIdentifier"] == regions.other.subnets["us-west-2b"] and group["DesiredCapacity"] == 1
    assert regions.other.instance(first.instance_id)["Placement"]["AvailabilityZone"] == "us-west-2b"

    second = await cloud.launch(job_spec(cloud, attempt=2), TYPES, "spot", zone="us-east-1a")
    assert second.zone == "us-east-1a"
    (left,) = west.describe_auto_scaling_groups(AutoScalingGroupNames=["finetune-ft-abc1"])["AutoScalingGroups"]
    assert left["DesiredCapacity"] == 0
    assert {group.desired for group in await cloud.list_groups()} == {0, 1}  # both regions' groups listed
    await cloud.terminate(second.instance_id, "ft-abc1")  # found in its region, its group there set to 0 first
    assert {group.desired for group in await cloud.list_groups()} == {0}


async def test_check_dry_runs_a_launch_in_each_region(
    regions: TwoRegions, proxy: Ec2Proxy, open_clouds: list[AwsCloud]
) -> None:
    good = AwsCloud(regions.settings())
    wrong_image = regions.settings().regions[OTHER].model_copy(update={"image_id": DEAD_IMAGE})
    bad = AwsCloud(regions.settings(regions={**regions.settings().regions, OTHER: wrong_image}))
    open_clouds.extend([good, bad])
    scope = SetupScope(instance_types=("g5.xlarge",))
    said = {check.name: check for check in await good.check_setup(scope)}
    assert said["AWS region"].ok and f"launches also in {OTHER}" in said["AWS region"].detail
    assert said[f"EC2 launch in {HOME} (dry run)"].ok and said[f"EC2 launch in {OTHER} (dry run)"].ok
    dry_runs = [(form[REGION_FORM_KEY], form["ImageId"]) for form in proxy.actions("RunInstances")]
    assert dry_runs == [(HOME, regions.home.image_id), (OTHER, regions.other.image_id)]
    # EC2 refuses an image that is not in the region (moto's dry run does not look: the proxy answers as EC2 does).
    proxy.run_instances_fault = lambda form: "InvalidAMIID.NotFound" if form.get("ImageId") == DEAD_IMAGE else None
    said = {check.name: check for check in await bad.check_setup(scope)}
    assert said[f"EC2 launch in {HOME} (dry run)"].ok
    wrong = said[f"EC2 launch in {OTHER} (dry run)"]  # only the region whose image is wrong
    assert not wrong.ok and "InvalidAMIID.NotFound" in wrong.detail and f"aws.regions.{OTHER}.image_id" in wrong.fix


class BothRegions:
    """What Ec2Bodies reads of EC2 (an instance's user data), from whichever region holds the instance."""

    def __init__(self, regions: TwoRegions) -> None:
        self.regions = regions

    def user_data(self, instance_id: str) -> str:
        for region in (self.regions.other, self.regions.home):
            if region.ec2.describe_instances(Filters=[{"Name": "instance-id", "Values": [instance_id]}])[
                "Reservations"
            ]:
                return region.user_data(instance_id)
        raise AssertionError(f"{instance_id} is in neither region")


async def test_start_runs_the_job_on_spot_in_the_region_with_room_and_a_warning_from_there_relaunches_it(
    tmp_path: Path, regions: TwoRegions, proxy: Ec2Proxy
) -> None:
    """Issue 51's story through the bot: ``start`` launches (the home region has no spot room, placement scores favour
    us-west-2) a spot instance in us-west-2, tagged with the job and attempt; its runner (booted from that instance's
    user data, reading its key object in the home bucket, reporting over SNS -> SQS in the home region) trains, and
    the card names the instance's zone. EC2's spot warning for it goes to us-west-2's EventBridge, whose rule puts it
    on us-west-2's queue (FINETUNE_SQS_QUEUE_URL lists both regions' queues); the bot takes it from there, alerts in
    the job's thread naming the zone, and relaunches; the new attempt resumes from the checkpoint the notice made and
    finishes, and the card names where it ran.

    moto's EventBridge has no SNS target (deploy/aws/finetune.yaml routes a region's rules through its events topic),
    so the rule here targets the queue directly: the delivery without an SNS envelope that the intake takes as well
    (the SNS hop is tests/test_aws_scenario.py's)."""
    proxy.run_instances_fault = no_spot_at_home
    proxy.regional_placement_scores = scores_favouring_the_other_region(regions)
    endpoint = regions.world.endpoint
    sns, sqs = boto3.client("sns", endpoint_url=endpoint), boto3.client("sqs", endpoint_url=endpoint)
    report_topic = sns.create_topic(Name="finetune-reports")["TopicArn"]
    queue_url = sqs.create_queue(QueueName="finetune-events")["QueueUrl"]
    queue_arn = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    sns.subscribe(TopicArn=report_topic, Protocol="sqs", Endpoint=queue_arn)
    # us-west-2's runner stack: its events queue (by the URL AWS gives, which names the region) and the spot rule.
    west_sqs = boto3.client("sqs", endpoint_url=endpoint, region_name=OTHER)
    west_sqs.create_queue(QueueName="finetune-events")
    west_queue_url = f"https://sqs.{OTHER}.amazonaws.com/123456789012/finetune-events"
    west_queue_arn = west_sqs.get_queue_attributes(QueueUrl=west_queue_url, AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"
    ]
    assert f":{OTHER}:" in west_queue_arn
    west_events = boto3.client("events", endpoint_url=endpoint, region_name=OTHER)
    pattern = {"source": ["aws.ec2"], "detail-type": ["EC2 Spot Instance Interruption Warning"]}
    west_events.put_rule(Name="finetune-spot-warning", EventPattern=json.dumps(pattern))
    west_events.put_targets(Rule="finetune-spot-warning", Targets=[{"Id": "finetune-events", "Arn": west_queue_arn}])
    settings = regions.settings(report_topic_arn=report_topic)
    (tmp_path / "instances").mkdir()
    cloud = Ec2Bodies(
        AwsCloud(settings, report_keys=ReportKeys(SECRET)), BothRegions(regions), tmp_path / "instances", endpoint
    )
    intake = {"finetune_sqs_queue_url": f"{queue_url},{west_queue_url}", "finetune_report_topics": report_topic}
    async with running_bot(tmp_path / "state", cloud=lambda _: cloud, **intake) as (service, chat):
        job_id = await start_job(service, "console:ana", "start tiny steps=20 step_seconds=0.25")
        running = await wait_job(
            service, job_id, lambda j: j.state is JobState.RUNNING and (j.step or 0) >= 6, timeout=180
        )
        first = running.attempts[0]
        assert first.market == "spot" and first.zone in OTHER_ZONES and first.instance_id
        described = regions.other.instance(first.instance_id)
        assert described["InstanceLifecycle"] == "spot"
        tags = {tag["Key"]: tag["Value"] for tag in described["Tags"]}
        assert (tags["finetune:job"], tags["finetune:attempt"]) == (job_id, "1")
        await wait_for_text(chat, "card", first.zone)  # the card names the zone, and so the region
        assert all(spot_request(form) for form in proxy.actions("RunInstances") if form[REGION_FORM_KEY] == HOME)

        # EC2 posts the notice on the instance, and the warning to us-west-2's EventBridge.
        process, imds = cloud.bodies[first.instance_id]
        imds.interrupt(seconds=120)
        warning = {
            "Source": "aws.ec2",
            "DetailType": "EC2 Spot Instance Interruption Warning",
            "Detail": json.dumps({"instance-id": first.instance_id, "instance-action": "terminate"}),
            "Resources": [f"arn:aws:ec2:{OTHER}:123456789012:instance/{first.instance_id}"],
        }
        assert west_events.put_events(Entries=[warning])["FailedEntryCount"] == 0
        warned_in = f"{first.instance_id} in {first.zone} (from aws.ec2)"
        await wait_for_text(chat, "thread", warned_in)  # through us-west-2's queue: no other carries it

        relaunched = await wait_job(
            service, job_id, lambda j: len(j.attempts) >= 2 and j.state is JobState.RUNNING, timeout=180
        )
        second = relaunched.attempts[1]
        assert second.number == 2 and second.instance_id not in (None, first.instance_id)
        assert second.market in ("spot", "on-demand") and second.zone  # wherever the spot authority put it
        placed = regions.region(second.zone).instance(second.instance_id)
        assert placed["Placement"]["AvailabilityZone"] == second.zone
        assert (placed.get("InstanceLifecycle") == "spot") == (second.market == "spot")
        tags = {tag["Key"]: tag["Value"] for tag in placed["Tags"]}
        assert (tags["finetune:job"], tags["finetune:attempt"]) == (job_id, "2")
        done = await wait_job(
            service,
            job_id,
            lambda j: j.state in (JobState.SUCCEEDED, JobState.RESUME_FAILED, JobState.FAILED),
            timeout=240,
        )
        assert await asyncio.wait_for(process.wait(), 30) == 75  # the first runner checkpointed on the notice
        await eventually(lambda: settled(service))
        west_left = west_sqs.get_queue_attributes(QueueUrl=west_queue_url, AttributeNames=["All"])["Attributes"]
        assert west_left["ApproximateNumberOfMessages"] == west_left["ApproximateNumberOfMessagesNotVisible"] == "0"

    assert done.state is JobState.SUCCEEDED and done.step == 20
    assert [attempt.zone for attempt in done.attempts] == [first.zone, second.zone]
    assert done.attempts[1].resumed_from_step is not None
    assert done.interruptions == 1 and done.steps_lost == 0
    said = [(channel, text) for job, channel, text in chat.transcript if job == job_id]
    warned = [index for index, (channel, text) in enumerate(said) if channel == "thread" and warned_in in text]
    alerts = [text for channel, text in said if channel == "alert"]
    assert len(warned) == 1 and len(alerts) == 1 and warned_in in alerts[0]
    resumed = f"Resumed on attempt 2 in {second.zone} from step {done.attempts[1].resumed_from_step}: 0 steps lost"
    assert any(resumed in text for channel, text in said[warned[0] :] if channel == "thread")
    cards = [text for channel, text in said[warned[0] :] if channel == "card"]
    assert any(second.zone in card for card in cards)  # a card since the warning names where the job went on
    for attempt in done.attempts:  # both instances released: the old by the bot, the last by its runner
        state = regions.region(str(attempt.zone)).instance(str(attempt.instance_id))["State"]["Name"]
        assert state in ("shutting-down", "terminated")
    assert regions.world.keys_under("attempt-keys/") == []  # released with their instances


# -- the settings --------------------------------------------------------------------------------------------


def config_error(text: str) -> str:
    with pytest.raises(ConfigError) as bad:
        parse_file_config(text, "config.yaml")
    message = str(bad.value)
    assert "\n" not in message  # one line
    return message


def test_regions_in_the_configuration() -> None:
    config = parse_file_config(
        "aws:\n  bucket: ckpt\n  region: us-east-1\n  regions:\n"
        "    us-west-2: {image_id: ami-2, subnets: {us-west-2a: subnet-2}, runner_role_id: AROAWEST}\n"
        "    us-east-1: {image_id: ami-1}\n",
        "config.yaml",
    )
    assert config.aws is not None
    ordered = config.aws.launch_regions("us-east-1")
    assert list(ordered) == ["us-east-1", "us-west-2"]  # the home region first, then the configured order
    assert ordered["us-west-2"].subnets == {"us-west-2a": "subnet-2"}
    assert config.aws.transfer_price_per_gb == AWS_TRANSFER_PRICE_PER_GB
    bound = config.aws.bound_to("us-west-2", ordered["us-west-2"])
    assert (bound.region, bound.image_id, bound.runner_role_id, bound.regions) == ("us-west-2", "ami-2", "AROAWEST", {})
    # Without regions, today's single-region keys are the one home region.
    single = AwsSettings(bucket="ckpt", region="eu-west-1", image_id="ami-1", zones=["eu-west-1b"])
    assert {name: launch.image_id for name, launch in single.launch_regions("eu-west-1").items()} == {
        "eu-west-1": "ami-1"
    }


@pytest.mark.parametrize(
    ("text", "said"),
    [
        (
            "  regions:\n    us-west-2: {subnets: {us-west-2a: subnet-2}}\n",
            "config.yaml: aws.regions.us-west-2: Value error, set image_id",
        ),
        (
            "  regions:\n    us-west-X: {image_id: ami-2}\n",
            "aws.regions: Value error, 'us-west-X' is not an AWS region name",
        ),
        (
            "  mode: autoscaling\n  regions:\n    us-west-2: {image_id: ami-2}\n",
            "aws.regions: Value error, us-west-2: autoscaling mode needs subnets",
        ),
        ("  image_id: ami-1\n  regions:\n    us-west-2: {image_id: ami-2}\n", "set image_id per region"),
        (
            "  regions:\n    us-west-2: {image_id: ami-2, vswitches: [vsw-1]}\n",
            "aws.regions.us-west-2.vswitches: no such",
        ),
        ("  transfer_price_per_gb: -1\n", "aws.transfer_price_per_gb: Input should be greater than or equal to 0"),
    ],
)
def test_a_region_without_what_a_launch_needs_is_a_one_line_error(text: str, said: str) -> None:
    assert said in config_error("aws:\n  bucket: ckpt\n  region: us-east-1\n" + text)


def test_regions_need_the_home_region_named() -> None:
    with pytest.raises(ValidationError, match="regions needs region"):
        AwsSettings(bucket="ckpt", regions={"us-west-2": {"image_id": "ami-2"}})


def test_a_launch_region_without_its_runner_role_is_a_config_error_when_reports_are_signed() -> None:
    settings = AwsSettings(
        bucket="ckpt",
        region="us-east-1",
        regions={"us-east-1": {"image_id": "ami-1", "runner_role_id": HOME_ROLE}, "us-west-2": {"image_id": "ami-2"}},
    )
    with pytest.raises(ConfigError, match=r"aws\.regions\.us-west-2\.runner_role_id is not set"):
        AwsCloud(settings, report_keys=ReportKeys("master"))

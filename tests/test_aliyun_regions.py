"""AliyunCloud across two regions (issue 51), with Alibaba's own SDKs against one local ECS endpoint per region
(tests/aliyun_fakes.py: each answers its own ``RegionId`` only, and checks the ACS3 signatures) and moto standing in
for the home region's OSS bucket.

The home region (cn-hangzhou) has no spot stock (``OperationDenied.NoStock``, ``WithoutStock``); the other
(cn-shanghai) has. The spot authority (handlers.decide over the provider's own zones and availability) places the
job in the other region, the launch goes there through that region's endpoint, tagged with the job and attempt, and
the card names the other region's zone.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import boto3
import pytest

import bot.cloud.base as cloud_base
from bot.chat.render import card
from bot.cloud.aliyun.provider import AliyunCloud
from bot.cloud.aliyun.settings import AliyunSettings, candidate_zones
from bot.cloud.base import GangPlacement, LaunchError, SetupScope, SpansRegions
from bot.errors import ConfigError
from bot.settings import parse_file_config
from handlers.decide import decide, new_job
from handlers.jobs import ChatRef
from handlers.messages import Launch, Launched
from handlers.spec import Gang, JobSpec
from handlers.spot import DEFAULT_POLICY, SpotView
from tests.aliyun_fakes import ACCESS_KEY_ID, ACCESS_KEY_SECRET, FakeAliyun

HOME, OTHER = "cn-hangzhou", "cn-shanghai"
BUCKET = "ft-oss"
GPU = "ecs.gn7i-c8g1.2xlarge"
HOME_VSWITCHES = {"cn-hangzhou-j": "vsw-hz-j", "cn-hangzhou-k": "vsw-hz-k"}
OTHER_VSWITCHES = {"cn-shanghai-b": "vsw-sh-b", "cn-shanghai-e": "vsw-sh-e"}
NOW = datetime(2026, 3, 2, 8, 30, tzinfo=UTC)


@pytest.fixture
async def fakes(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[dict[str, FakeAliyun]]:
    monkeypatch.setenv("ALIBABA_CLOUD_ECS_METADATA_DISABLED", "true")  # never ask a real metadata service
    monkeypatch.setattr(cloud_base, "_logged_once", set())
    home, other = await FakeAliyun(HOME).start(), await FakeAliyun(OTHER).start()
    home.vswitch_zones = {vswitch: zone for zone, vswitch in HOME_VSWITCHES.items()}
    other.vswitch_zones = {vswitch: zone for zone, vswitch in OTHER_VSWITCHES.items()}
    # Spot is cheaper at home, so a launch without a signal of stock tries home first.
    home.spot_prices = {("cn-hangzhou-j", GPU): 2.0, ("cn-hangzhou-k", GPU): 2.2}
    other.spot_prices = {("cn-shanghai-b", GPU): 2.6, ("cn-shanghai-e", GPU): 2.4}
    home.on_demand_prices = other.on_demand_prices = {GPU: 10.0}
    home.no_stock = set(HOME_VSWITCHES)  # sold out at home: RunInstances answers OperationDenied.NoStock
    yield {HOME: home, OTHER: other}
    await home.stop()
    await other.stop()


@pytest.fixture
def bucket(aws: str) -> Any:
    s3 = boto3.client("s3", endpoint_url=aws)
    s3.create_bucket(Bucket=BUCKET)
    return s3


def settings(fakes: dict[str, FakeAliyun], oss: str, **changes: Any) -> AliyunSettings:
    values: dict[str, Any] = {
        "region": HOME,
        "bucket": BUCKET,
        "endpoint": fakes[HOME].endpoint,
        "ess_endpoint": fakes[HOME].endpoint,
        "access_key_id": ACCESS_KEY_ID,
        "access_key_secret": ACCESS_KEY_SECRET,
        "allow_static_keys": True,  # the test double's key pair; deployed, the RAM role's STS key
        "oss_endpoint": oss,
        "oss_addressing": "path",
        "ram_role": "finetune-runner",
        "group_poll_seconds": 0.05,
        "regions": {  # the other region listed first: the home region still comes first
            OTHER: {
                "vswitches": OTHER_VSWITCHES,
                "image_id": "m-runner-sh",
                "security_group_ids": ["sg-sh"],
                "key_pair": "ops-sh",
                "endpoint": fakes[OTHER].endpoint,
            },
            HOME: {"vswitches": HOME_VSWITCHES, "image_id": "m-runner-hz", "security_group_ids": ["sg-hz"]},
        },
    }
    values.update(changes)
    return AliyunSettings(**values)


@pytest.fixture
async def make_cloud(fakes: dict[str, FakeAliyun], bucket: Any, aws: str) -> AsyncIterator[Callable[..., AliyunCloud]]:
    clouds: list[AliyunCloud] = []

    def make(**changes: Any) -> AliyunCloud:
        cloud = AliyunCloud(settings(fakes, aws, **changes))
        clouds.append(cloud)
        return cloud

    yield make
    for cloud in clouds:
        await cloud.close()


def job_spec(cloud: AliyunCloud, job_id: str = "ft-abc1", attempt: int = 1) -> JobSpec:
    return JobSpec(
        version=1,
        job_id=job_id,
        attempt=attempt,
        command=["python", "-m", "runner.hf.tiny"],
        checkpoint_uri=cloud.checkpoint_uri(job_id),
        notice="aliyun",
        key_salt="5a" * 16,
    )


def env_of(script: str) -> dict[str, str]:
    """The runner's environment as the boot script writes it (``NAME=value`` lines of its heredoc)."""
    body = script.split("<<'ENV'\n", 1)[1].split("\nENV\n", 1)[0]
    return dict(line.split("=", 1) for line in body.splitlines())


# -- settings -------------------------------------------------------------------------------------------------


def config_error(aliyun: str) -> str:
    with pytest.raises(ConfigError) as refused:
        parse_file_config(aliyun, "config.yaml")
    return str(refused.value)


BASE = "aliyun:\n  region: cn-hangzhou\n  bucket: ft-oss\n"


def test_a_region_without_what_a_launch_needs_is_a_one_line_error_naming_it() -> None:
    no_image = config_error(BASE + "  regions:\n    cn-shanghai:\n      vswitches: {cn-shanghai-b: vsw-b}\n")
    assert "\n" not in no_image
    assert "aliyun.regions.cn-shanghai.image_id: Field required" in no_image
    no_vswitch = config_error(BASE + "  regions:\n    cn-shanghai:\n      image_id: m-1\n")
    assert "aliyun.regions.cn-shanghai.vswitches: Field required" in no_vswitch
    empty = config_error(BASE + "  regions:\n    cn-shanghai:\n      image_id: m-1\n      vswitches: {}\n")
    assert "aliyun.regions.cn-shanghai.vswitches" in empty
    stranger = config_error(
        BASE + "  regions:\n    cn-shanghai:\n      image_id: m-1\n      vswitches: {cn-hangzhou-h: v}\n"
    )
    assert "cn-shanghai: zones ['cn-hangzhou-h'] are not in cn-shanghai" in stranger
    typo = config_error(BASE + "  regions:\n    cn-shanghai:\n      image_id: m-1\n      vswitch: {cn-shanghai-b: v}\n")
    assert "aliyun.regions.cn-shanghai.vswitch: no such key" in typo
    bad_name = config_error(BASE + "  regions:\n    Shanghai:\n      image_id: m-1\n      vswitches: {Shanghai-b: v}\n")
    assert "'Shanghai' is not an Alibaba Cloud region id" in bad_name
    region = "  regions:\n    cn-shanghai:\n      image_id: m-1\n      vswitches: {cn-shanghai-b: v}\n"
    mixed = config_error(BASE + "  image_id: m-0\n  vswitches: {cn-hangzhou-h: v}\n" + region)
    assert "vswitches, image_id go under each region (aliyun.regions.<region>)" in mixed
    groups = config_error(BASE + "  mode: scaling-group\n  scaling_groups: [asg-1]\n" + region)
    assert "scaling-group mode runs in aliyun.region alone" in groups


def test_without_regions_the_top_level_keys_are_the_home_region() -> None:
    one = parse_file_config(BASE + "  image_id: m-0\n  vswitches: {cn-hangzhou-h: v, cn-hangzhou-j: w}\n", "c").aliyun
    assert one is not None and one.regions == {}
    assert candidate_zones(one) == ["cn-hangzhou-h", "cn-hangzhou-j"]
    assert one.transfer_price_per_gb == 0.5  # OSS's outbound Internet traffic, CNY per GB (docs/aliyun.md)
    region = "  regions:\n    cn-shanghai:\n      image_id: m-1\n      vswitches: {cn-shanghai-b: v}\n"
    home = "    cn-hangzhou:\n      image_id: m-0\n      vswitches: {cn-hangzhou-h: v}\n      zones: [cn-hangzhou-h]\n"
    two = parse_file_config(BASE + "  transfer_price_per_gb: 0.12\n" + region + home, "c").aliyun
    assert two is not None and two.transfer_price_per_gb == 0.12
    assert candidate_zones(two) == ["cn-hangzhou-h", "cn-shanghai-b"]  # home first, then as configured
    # A runner at home reads the bucket internally; elsewhere the internal endpoint does not answer.
    assert two.runner_oss_endpoint_in(HOME) == "https://oss-cn-hangzhou-internal.aliyuncs.com"
    assert two.runner_oss_endpoint_in(OTHER) == "https://oss-cn-hangzhou.aliyuncs.com"


# -- zones, availability, launches ----------------------------------------------------------------------------


async def test_zones_and_availability_come_from_every_region_asked_in_its_own(
    fakes: dict[str, FakeAliyun], make_cloud: Callable[..., AliyunCloud]
) -> None:
    fakes[HOME].stock = {"cn-hangzhou-j": "WithoutStock", "cn-hangzhou-k": "WithoutStock"}
    fakes[OTHER].stock = {"cn-shanghai-b": "WithStock", "cn-shanghai-e": "ClosedWithStock"}
    cloud = make_cloud()
    assert isinstance(cloud, SpansRegions) and (cloud.home_region, cloud.transfer_price_per_gb) == (HOME, 0.5)
    assert await cloud.spot_zones([GPU]) == ["cn-hangzhou-j", "cn-hangzhou-k", "cn-shanghai-b", "cn-shanghai-e"]
    availability = await cloud.zone_availability([GPU])
    assert availability == {"cn-hangzhou-j": 0.0, "cn-hangzhou-k": 0.0, "cn-shanghai-b": 1.0, "cn-shanghai-e": 0.6}
    for region, fake in fakes.items():
        (asked,) = fake.actions("DescribeAvailableResource")
        assert asked["RegionId"] == region
        assert {call["RegionId"] for call in fake.actions("DescribeSpotPriceHistory")} == {region}
        assert fake.rejected == []  # signed with our key, and each region's calls went to its own endpoint
    assert await cloud.hourly_price([GPU], "spot") == 2.0  # the cheapest anywhere


async def test_the_spot_authority_places_the_job_in_the_region_with_stock_and_the_card_names_its_zone(
    fakes: dict[str, FakeAliyun], make_cloud: Callable[..., AliyunCloud]
) -> None:
    fakes[HOME].stock = {"cn-hangzhou-j": "WithoutStock", "cn-hangzhou-k": "WithoutStock"}
    fakes[OTHER].stock = {"cn-shanghai-b": "WithStock", "cn-shanghai-e": "WithoutStock"}
    cloud = make_cloud()
    types = [GPU]
    view = SpotView(  # what bot/core.py reads from the cloud for the spot authority
        zones=tuple(await cloud.spot_zones(types)),
        spot_price=await cloud.hourly_price(types, "spot"),
        on_demand_price=await cloud.hourly_price(types, "on-demand"),
        scores=await cloud.zone_availability(types),
    )
    chat = ChatRef(platform="console", channel="c")
    deadline = NOW + timedelta(days=2)  # a steered job: the spot authority names the zone
    change = new_job(
        "ft-abc1", "tiny", {}, "console:ana", chat, NOW, 200, deadline=deadline, spot_policy=DEFAULT_POLICY, spot=view
    )
    (launch,) = [message for message in change.outbox if isinstance(message, Launch)]
    assert (launch.market, launch.zone) == ("spot", "cn-shanghai-b")  # the other region's zone with stock

    instance = await cloud.launch(job_spec(cloud, attempt=launch.attempt), types, launch.market, zone=launch.zone)
    assert (instance.zone, instance.market, instance.price_per_hour) == ("cn-shanghai-b", "spot", 2.6)
    assert fakes[HOME].actions("RunInstances") == []  # nothing asked of the sold-out home region
    (run,) = fakes[OTHER].actions("RunInstances")
    assert (run["RegionId"], run["ZoneId"], run["VSwitchId"]) == (OTHER, "cn-shanghai-b", "vsw-sh-b")
    assert (run["ImageId"], run["SecurityGroupIds.1"], run["KeyPairName"]) == ("m-runner-sh", "sg-sh", "ops-sh")
    assert run["SpotStrategy"] == "SpotAsPriceGo"
    started = fakes[OTHER].instances[instance.instance_id]
    assert started.tags == {"finetune:managed": "true", "finetune:job": "ft-abc1", "finetune:attempt": "1"}
    env = env_of(started.user_data)  # the runner reaches the home bucket at its public endpoint, in its region
    assert (env["OSS_ENDPOINT"], env["OSS_REGION"]) == ("https://oss-cn-hangzhou.aliyuncs.com", HOME)
    assert env["FINETUNE_SPEC"] == "oss://ft-oss/jobs/ft-abc1/spec-attempt-1.json"

    launched = Launched(
        job_id="ft-abc1",
        attempt=launch.attempt,
        instance_id=instance.instance_id,
        instance_type=instance.instance_type,
        zone=instance.zone,
        market=instance.market,
    )
    job = decide(change.job, launched, NOW, spot=view).job
    fields = dict(card(job, NOW).fields)
    assert "cn-shanghai-b" in fields["Instance"] and instance.instance_id in fields["Instance"]


async def test_a_refusal_for_stock_at_home_moves_the_launch_to_the_next_region_within_the_attempt(
    fakes: dict[str, FakeAliyun], make_cloud: Callable[..., AliyunCloud]
) -> None:
    cloud = make_cloud()  # no stock signal: the cheaper home zones come first
    instance = await cloud.launch(job_spec(cloud), [GPU], "spot")
    tried = [(call["RegionId"], call["ZoneId"]) for fake in fakes.values() for call in fake.actions("RunInstances")]
    assert tried == [(HOME, "cn-hangzhou-j"), (HOME, "cn-hangzhou-k"), (OTHER, "cn-shanghai-e")]
    assert (instance.zone, instance.price_per_hour) == ("cn-shanghai-e", 2.4)
    assert [i.instance_id for i in fakes[OTHER].live()] == [instance.instance_id] and fakes[HOME].live() == []
    # Pinned by the spot authority to a home zone: there only, and the refusal says capacity (it chooses again).
    with pytest.raises(LaunchError) as refused:
        await cloud.launch(job_spec(cloud, attempt=2), [GPU], "spot", zone="cn-hangzhou-k")
    assert refused.value.capacity and "OperationDenied.NoStock" in str(refused.value)
    assert len(fakes[OTHER].actions("RunInstances")) == 1


async def test_instance_operations_find_the_region_the_instance_is_in(
    fakes: dict[str, FakeAliyun], make_cloud: Callable[..., AliyunCloud], bucket: Any
) -> None:
    cloud = make_cloud()
    away = await cloud.launch(job_spec(cloud), [GPU], "spot", zone="cn-shanghai-b")
    fakes[HOME].no_stock = set()
    home = await cloud.launch(job_spec(cloud, "ft-home2"), [GPU], "spot", zone="cn-hangzhou-j")

    fresh = make_cloud()  # remembers nothing: every region is asked
    listed = {(found.instance_id, found.job_id) for found in await fresh.list_instances()}
    assert listed == {(away.instance_id, "ft-abc1"), (home.instance_id, "ft-home2")}
    await fresh.stop_runner(away.instance_id)
    control = bucket.get_object(Bucket=BUCKET, Key="jobs/ft-abc1/control/attempt-1.json")["Body"].read()
    assert b'"stop"' in control

    other = make_cloud()
    await other.terminate(away.instance_id, "ft-abc1")
    assert fakes[OTHER].deleted == [away.instance_id] and fakes[HOME].deleted == []
    await other.terminate(away.instance_id, "ft-abc1")  # gone already: fine
    assert [i.instance_id for i in fakes[HOME].live()] == [home.instance_id]
    assert all(fake.rejected == [] for fake in fakes.values())


async def test_a_gangs_deployment_set_is_made_in_the_region_its_nodes_run_in(
    fakes: dict[str, FakeAliyun], make_cloud: Callable[..., AliyunCloud]
) -> None:
    cloud = make_cloud()
    gang = Gang(nodes=2, node_rank=0, generation=1, master_addr="192.168.0.10", master_port=29500)
    spec = job_spec(cloud, "ft-gang1").model_copy(update={"gang": gang})
    node = await cloud.launch(spec, [GPU], "spot", zone="cn-shanghai-b", gang=GangPlacement("ft-gang1"))
    (made,) = fakes[OTHER].deployment_sets.values()
    assert made.instances == [node.instance_id] and fakes[HOME].deployment_sets == {}
    await cloud.terminate(node.instance_id, "ft-gang1")
    await cloud.release_gang_placement("ft-gang1")
    assert fakes[OTHER].deployment_sets == {}


async def test_the_set_up_check_dry_runs_a_launch_in_every_region(
    fakes: dict[str, FakeAliyun], make_cloud: Callable[..., AliyunCloud]
) -> None:
    fakes[HOME].regions = [HOME, OTHER]
    checks = await make_cloud().check_setup(SetupScope(instance_types=(GPU,)))
    by_name = {check.name: check for check in checks}
    assert by_name["ECS launch in cn-hangzhou (dry run)"].ok
    assert by_name["ECS launch in cn-shanghai (dry run)"].ok
    (dry,) = fakes[OTHER].actions("RunInstances")
    assert (dry["RegionId"], dry["ImageId"], dry["DryRun"].lower()) == (OTHER, "m-runner-sh", "true")
    fakes[HOME].regions = [HOME]  # an account ECS offers no cn-shanghai
    refused = {check.name: check for check in await make_cloud().check_setup(SetupScope(instance_types=(GPU,)))}
    assert not refused["Alibaba Cloud credentials"].ok
    assert "no region cn-shanghai" in refused["Alibaba Cloud credentials"].detail

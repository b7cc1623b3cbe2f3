"""AliyunCloud with Alibaba's own SDKs against a local ECS / ESS OpenAPI endpoint (tests/aliyun_fakes.py), which
checks their ACS3 signatures, and moto in server mode as the S3-API bucket standing in for OSS.

The fake supplies: instances with tags and user-data, sold-out zones, unsupported types, spot and pay-as-you-go
prices, scaling groups that follow their desired capacity over vSwitches in priority order. moto supplies the
bucket the spec and the runner's control object go to; the runner's own control-object reader reads them back.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import boto3
import pytest
from pydantic import ValidationError

import bot.cloud.base as cloud_base
from bot.cloud.aliyun.provider import AliyunCloud
from bot.cloud.aliyun.settings import AliyunSettings
from bot.cloud.base import ForeignInstance, GangPlacement, Instance, LaunchError, launches_ahead
from bot.errors import CloudError
from handlers.messages import Launch
from handlers.report_keys import ReportKeys
from handlers.spec import Gang, JobSpec, RegroupControl, control_key, node_control_key, parse_spec
from runner.notices.control import ControlObjectSource, read_go, read_regroup
from runner.storage.s3 import S3Store
from tests.aliyun_fakes import ACCESS_KEY_ID, ACCESS_KEY_SECRET, FakeAliyun
from tests.gang_launches import launch_two_nodes

REGION = "cn-hangzhou"
BUCKET = "ft-oss"
MASTER = "the-bots-master-report-secret"
SALT = "5a" * 16  # the key salt of every attempt job_spec makes (the job record's, in the bot)
GPU = "ecs.gn7i-c8g1.2xlarge"
GPU_BIG = "ecs.gn7i-c16g1.4xlarge"
VSWITCHES = {"cn-hangzhou-j": "vsw-j", "cn-hangzhou-k": "vsw-k", "cn-hangzhou-h": "vsw-h"}
ZONES = list(VSWITCHES)


@pytest.fixture
async def fake(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[FakeAliyun]:
    monkeypatch.setenv("ALIBABA_CLOUD_ECS_METADATA_DISABLED", "true")  # never ask a real metadata service
    monkeypatch.setattr(cloud_base, "_logged_once", set())
    started = await FakeAliyun(REGION).start()
    started.vswitch_zones = {vswitch: zone for zone, vswitch in VSWITCHES.items()}
    started.spot_prices = {
        ("cn-hangzhou-j", GPU): 3.0,
        ("cn-hangzhou-k", GPU): 2.0,
        ("cn-hangzhou-h", GPU): 2.5,
        ("cn-hangzhou-j", GPU_BIG): 5.0,
    }
    started.on_demand_prices = {GPU: 10.0, GPU_BIG: 18.0}
    yield started
    await started.stop()


@pytest.fixture
def bucket(aws: str) -> Any:
    s3 = boto3.client("s3", endpoint_url=aws)
    s3.create_bucket(Bucket=BUCKET)
    return s3


@pytest.fixture
async def make_cloud(fake: FakeAliyun, bucket: Any, aws: str) -> AsyncIterator[Callable[..., AliyunCloud]]:
    clouds: list[AliyunCloud] = []

    def make(**changes: Any) -> AliyunCloud:
        cloud = AliyunCloud(settings(fake, aws, **changes), report_keys=ReportKeys(MASTER))
        clouds.append(cloud)
        return cloud

    yield make
    for cloud in clouds:
        await cloud.close()


def settings(fake: FakeAliyun, oss: str, **changes: Any) -> AliyunSettings:
    values: dict[str, Any] = {
        "region": REGION,
        "bucket": BUCKET,
        "endpoint": fake.endpoint,
        "ess_endpoint": fake.endpoint,
        "access_key_id": ACCESS_KEY_ID,
        "access_key_secret": ACCESS_KEY_SECRET,
        "allow_static_keys": True,  # the test double's key pair; deployed, the RAM role's STS key
        "oss_endpoint": oss,
        "oss_addressing": "path",  # moto on 127.0.0.1 has no bucket host names
        "vswitches": VSWITCHES,
        "zones": ZONES,
        "security_group_ids": ["sg-runner"],
        "image_id": "m-finetune-runner",
        "ram_role": "finetune-runner",
        "interrupt_test_grace_seconds": 0.3,
        "group_poll_seconds": 0.05,
        "group_wait_seconds": 3,
    }
    values.update(changes)
    return AliyunSettings(**values)


def job_spec(cloud: AliyunCloud, job_id: str = "ft-abc1", attempt: int = 1) -> JobSpec:
    return JobSpec(
        version=1,
        job_id=job_id,
        attempt=attempt,
        command=["python", "-m", "runner.hf.tiny"],
        checkpoint_uri=cloud.checkpoint_uri(job_id),
        notice="aliyun",
        key_salt=SALT,
    )


def oss_store(oss: str, prefix: str) -> S3Store:
    """The runner's own store on the bucket, configured as a runner on ECS would be (but path-style on moto)."""
    env = {
        "OSS_ENDPOINT": oss,
        "OSS_REGION": REGION,
        "FINETUNE_S3_ADDRESSING": "path",
        "ALIBABA_CLOUD_ACCESS_KEY_ID": "runner",
        "ALIBABA_CLOUD_ACCESS_KEY_SECRET": "runner-secret",
    }
    return S3Store(f"oss://{BUCKET}/{prefix}", env=env)


async def until(condition: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


# -- settings -------------------------------------------------------------------------------------------------


def test_settings_say_what_is_missing() -> None:
    base: dict[str, Any] = {"region": REGION, "bucket": BUCKET}
    with pytest.raises(ValidationError, match="image_id"):
        AliyunSettings(**base, vswitches=VSWITCHES)
    with pytest.raises(ValidationError, match="vswitches"):
        AliyunSettings(**base, image_id="m-1")
    with pytest.raises(ValidationError, match="scaling_groups"):
        AliyunSettings(**base, mode="scaling-group")
    with pytest.raises(ValidationError, match="no vSwitch"):
        AliyunSettings(**base, image_id="m-1", vswitches=VSWITCHES, zones=["cn-hangzhou-z"])
    with pytest.raises(ValidationError, match="region"):
        AliyunSettings(**{**base, "region": "Hangzhou"}, image_id="m-1", vswitches=VSWITCHES)
    with pytest.raises(ValidationError, match="endpoint"):
        AliyunSettings(**base, image_id="m-1", vswitches=VSWITCHES, endpoint="ftp://ecs.example.com")
    with pytest.raises(ValidationError, match="both"):
        AliyunSettings(**base, image_id="m-1", vswitches=VSWITCHES, access_key_id="LTAI-only-half")
    with pytest.raises(ValidationError, match="absolute path"):
        AliyunSettings(**base, image_id="m-1", vswitches=VSWITCHES, work_dir="/tmp/x'; rm -rf /")
    ok = AliyunSettings(**base, image_id="m-1", vswitches=VSWITCHES)
    assert ok.bot_oss_endpoint == "https://oss-cn-hangzhou.aliyuncs.com"
    assert ok.runner_oss_endpoint == "https://oss-cn-hangzhou-internal.aliyuncs.com"
    cloud = AliyunCloud(ok)
    assert (cloud.name, cloud.notice) == ("aliyun", "aliyun")
    assert cloud.checkpoint_uri("ft-7k2q") == "oss://ft-oss/jobs/ft-7k2q/"
    assert cloud.control_key("ft-7k2q", 3) == "jobs/ft-7k2q/control/attempt-3.json"


# -- instances mode -------------------------------------------------------------------------------------------


async def test_spot_launch_goes_to_the_cheapest_zone_with_tags_user_data_and_the_spec_on_oss(
    fake: FakeAliyun, bucket: Any, make_cloud: Callable[..., AliyunCloud]
) -> None:
    cloud = make_cloud(report_url="https://bot.example.com/runner/reports")
    instance = await cloud.launch(job_spec(cloud), [GPU], "spot")

    assert (instance.zone, instance.instance_type, instance.market) == ("cn-hangzhou-k", GPU, "spot")
    assert (instance.price_per_hour, instance.on_demand_price_per_hour) == (2.0, 10.0)
    assert fake.rejected == []  # every SDK request carried a valid ACS3 signature of our key pair
    (run,) = fake.actions("RunInstances")
    assert run["SpotStrategy"] == "SpotAsPriceGo"
    assert run["SpotInterruptionBehavior"] == "Terminate"
    assert "SpotPriceLimit" not in run
    assert (run["ZoneId"], run["VSwitchId"], run["InstanceChargeType"]) == ("cn-hangzhou-k", "vsw-k", "PostPaid")
    assert (run["ImageId"], run["SecurityGroupIds.1"], run["RamRoleName"]) == (
        "m-finetune-runner",
        "sg-runner",
        "finetune-runner",
    )
    assert run["ClientToken"]
    created = fake.instances[instance.instance_id]
    assert created.tags == {"finetune:managed": "true", "finetune:job": "ft-abc1", "finetune:attempt": "1"}
    assert created.name == "finetune-ft-abc1-1"

    script = created.user_data
    assert script.startswith("#!/bin/bash\n")
    assert "FINETUNE_SPEC=oss://ft-oss/jobs/ft-abc1/spec-attempt-1.json\n" in script
    assert "OSS_ENDPOINT=https://oss-cn-hangzhou-internal.aliyuncs.com\n" in script  # the runner's way to OSS
    assert "ALIBABA_CLOUD_ECS_METADATA=finetune-runner\n" in script
    assert "umask 077" in script
    assert not any(word in script for word in ("pip ", "apt", "curl", "wget"))  # installs nothing at boot
    # Hardened metadata, and no secret where the metadata service (or DescribeUserData, or the tags) shows it.
    assert (run["HttpTokens"], run["HttpEndpoint"]) == ("required", "enabled")
    attempt_key = ReportKeys(MASTER).of("ft-abc1", 1, SALT)
    for secret in (MASTER, attempt_key, ACCESS_KEY_SECRET):
        assert secret not in repr(created.tags) and secret not in run["InstanceName"]
    # None of the bot's own secrets in user data; the attempt's own key only there (its instance's metadata serves it
    # to that instance alone, where every runner may read the bucket's jobs/).
    assert MASTER not in script and ACCESS_KEY_SECRET not in script
    assert f"FINETUNE_REPORT_SECRET={attempt_key}\n" in script
    raw_spec = bucket.get_object(Bucket=BUCKET, Key="jobs/ft-abc1/spec-attempt-1.json")["Body"].read()
    spec = parse_spec(raw_spec)
    assert (spec.job_id, spec.attempt, spec.notice) == ("ft-abc1", 1, "aliyun")
    assert spec.report == ["https://bot.example.com/runner/reports"]
    assert attempt_key.encode() not in raw_spec  # not in the spec object: every runner may read the bucket's jobs/
    assert spec.release is None  # the bot releases the capacity (terminate on completion)


async def test_a_launch_carried_out_again_finds_the_attempts_instance(
    fake: FakeAliyun, make_cloud: Callable[..., AliyunCloud]
) -> None:
    """After a crash between RunInstances and its record, the retry finds the instance by its tags, even when
    the zone it started in is sold out now (so the retry would begin elsewhere, with another client token)."""
    cloud = make_cloud()
    first = await cloud.launch(job_spec(cloud), [GPU], "spot")
    fake.no_stock.add(first.zone)

    again = await cloud.launch(job_spec(cloud), [GPU], "spot")

    assert again.instance_id == first.instance_id and (again.zone, again.market) == (first.zone, "spot")
    assert len(fake.actions("RunInstances")) == 1
    assert [i.instance_id for i in fake.instances.values() if i.status != "Deleted"] == [first.instance_id]


async def test_sold_out_zones_move_on_and_reclaimed_zones_go_last(
    fake: FakeAliyun, make_cloud: Callable[..., AliyunCloud]
) -> None:
    fake.no_stock = {"cn-hangzhou-k"}
    fake.unsupported = {("cn-hangzhou-j", GPU)}
    cloud = make_cloud()
    instance = await cloud.launch(job_spec(cloud), [GPU, GPU_BIG], "spot", avoid_zones=["cn-hangzhou-h"])

    tried = [(call["ZoneId"], call["InstanceType"]) for call in fake.actions("RunInstances")]
    # Cheapest first (k 2.0, then j 3.0, then j's big type at 5.0), the avoided zone h last although at 2.5.
    assert tried == [("cn-hangzhou-k", GPU), ("cn-hangzhou-j", GPU), ("cn-hangzhou-j", GPU_BIG)]
    assert (instance.zone, instance.instance_type, instance.price_per_hour) == ("cn-hangzhou-j", GPU_BIG, 5.0)
    assert instance.on_demand_price_per_hour == 18.0


async def test_a_price_limit_and_a_spot_duration_are_asked_for(
    fake: FakeAliyun, make_cloud: Callable[..., AliyunCloud]
) -> None:
    cloud = make_cloud(spot_price_limit=4.5, spot_duration=0, system_disk_category="cloud_essd", system_disk_size=200)
    await cloud.launch(job_spec(cloud), [GPU], "spot")
    (run,) = fake.actions("RunInstances")
    assert (run["SpotStrategy"], run["SpotPriceLimit"], run["SpotDuration"]) == ("SpotWithPriceLimit", "4.5", "0")
    assert (run["SystemDisk.Category"], run["SystemDisk.Size"]) == ("cloud_essd", "200")


async def test_after_max_capacity_failures_it_reports_a_capacity_refusal_never_on_demand(
    fake: FakeAliyun, make_cloud: Callable[..., AliyunCloud]
) -> None:
    fake.run_fault = lambda params: "OperationDenied.NoStock" if params["SpotStrategy"] != "NoSpot" else None
    cloud = make_cloud(max_launch_failures=2)
    with pytest.raises(LaunchError) as refused:
        await cloud.launch(job_spec(cloud), [GPU], "spot")
    assert refused.value.capacity  # the spot authority (handlers/spot/) chooses on-demand, not the provider

    strategies = [call["SpotStrategy"] for call in fake.actions("RunInstances")]
    assert strategies == ["SpotAsPriceGo", "SpotAsPriceGo"]


async def test_a_zone_the_spot_policy_chose_is_tried_alone_and_a_refusal_says_capacity(
    fake: FakeAliyun, make_cloud: Callable[..., AliyunCloud]
) -> None:
    cloud = make_cloud(max_launch_failures=1)
    pinned = await cloud.launch(job_spec(cloud), [GPU], "spot", zone=ZONES[-1])
    assert (pinned.zone, pinned.market) == (ZONES[-1], "spot")
    fake.no_stock = {ZONES[0]}
    with pytest.raises(LaunchError) as refused:
        await cloud.launch(job_spec(cloud, attempt=2), [GPU], "spot", zone=ZONES[0])
    assert refused.value.capacity and refused.value.zone == ZONES[0]
    tried = [(call["ZoneId"], call["SpotStrategy"] != "NoSpot") for call in fake.actions("RunInstances")]
    assert tried == [(ZONES[-1], True), (ZONES[0], True)]  # no other zone, no on-demand


async def test_on_demand_asks_for_no_spot_and_no_prices(
    fake: FakeAliyun, make_cloud: Callable[..., AliyunCloud]
) -> None:
    cloud = make_cloud(spot_price_limit=4.5)
    instance = await cloud.launch(job_spec(cloud), [GPU], "on-demand")
    (run,) = fake.actions("RunInstances")
    assert run["SpotStrategy"] == "NoSpot"
    assert "SpotPriceLimit" not in run and "SpotInterruptionBehavior" not in run
    assert fake.actions("DescribeSpotPriceHistory") == []
    assert (instance.market, instance.price_per_hour, instance.on_demand_price_per_hour) == ("on-demand", 10.0, 10.0)


async def test_refusals_end_in_a_launch_error_naming_each_try(
    fake: FakeAliyun, make_cloud: Callable[..., AliyunCloud]
) -> None:
    fake.no_stock = set(ZONES)
    cloud = make_cloud(max_launch_failures=None)  # every candidate of the market
    with pytest.raises(LaunchError, match="every candidate failed") as failed:
        await cloud.launch(job_spec(cloud), [GPU], "spot")
    assert str(failed.value).count("OperationDenied.NoStock") == 3
    assert fake.live() == []

    fake.no_stock = set()
    fake.run_fault = lambda params: "InvalidImageId.NotFound"
    before = len(fake.actions("RunInstances"))
    with pytest.raises(LaunchError, match=r"launch refused: .*InvalidImageId\.NotFound"):
        await cloud.launch(job_spec(cloud, attempt=2), [GPU], "spot")
    assert len(fake.actions("RunInstances")) == before + 1  # a bad image fails everywhere: no second try


async def test_a_spec_oss_refuses_ends_the_launch_before_any_instance(
    fake: FakeAliyun, make_cloud: Callable[..., AliyunCloud]
) -> None:
    cloud = make_cloud(bucket="ft-no-such-bucket")
    with pytest.raises(LaunchError, match=r"could not upload the spec to oss://ft-no-such-bucket/.*NoSuchBucket"):
        await cloud.launch(job_spec(cloud), [GPU], "spot")
    assert fake.actions("RunInstances") == []


async def test_without_price_history_the_configured_order_decides(
    fake: FakeAliyun, make_cloud: Callable[..., AliyunCloud]
) -> None:
    fake.fail_price_history = True
    cloud = make_cloud(zones=["cn-hangzhou-h", "cn-hangzhou-j"])
    instance = await cloud.launch(job_spec(cloud), [GPU], "spot")
    assert instance.zone == "cn-hangzhou-h"
    assert instance.price_per_hour is None  # unknown, never made up
    assert instance.on_demand_price_per_hour == 10.0  # DescribePrice still answers


async def test_prices_for_the_spend_guard(fake: FakeAliyun, make_cloud: Callable[..., AliyunCloud]) -> None:
    cloud = make_cloud()
    assert await cloud.hourly_price([GPU, GPU_BIG], "spot") == 2.0
    assert await cloud.hourly_price([GPU, GPU_BIG], "on-demand") == 10.0
    assert await cloud.on_demand_price("ecs.unknown") is None
    fake.on_demand_prices[GPU] = 99.0
    assert await cloud.on_demand_price(GPU) == 10.0  # cached for an hour
    assert make_cloud(on_demand_prices={GPU: 7.5}).settings.on_demand_prices[GPU] == 7.5
    assert await make_cloud(on_demand_prices={GPU: 7.5}).on_demand_price(GPU) == 7.5


async def test_the_sdks_credentials_come_from_the_standard_variables(
    fake: FakeAliyun, make_cloud: Callable[..., AliyunCloud], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ALIBABA_CLOUD_ACCESS_KEY_ID", ACCESS_KEY_ID)
    monkeypatch.setenv("ALIBABA_CLOUD_ACCESS_KEY_SECRET", ACCESS_KEY_SECRET)
    cloud = make_cloud(access_key_id=None, access_key_secret=None)
    instance = await cloud.launch(job_spec(cloud), [GPU], "spot")
    assert instance.instance_id in fake.instances
    assert fake.rejected == []


async def test_a_wrong_secret_is_refused_by_the_endpoint(
    fake: FakeAliyun, make_cloud: Callable[..., AliyunCloud]
) -> None:
    cloud = make_cloud(access_key_secret="not-the-secret")
    with pytest.raises(LaunchError, match="SignatureDoesNotMatch"):
        await cloud.launch(job_spec(cloud), [GPU], "spot")
    assert "signature" in fake.rejected
    assert fake.live() == []


async def test_terminate_releases_and_tolerates_a_missing_instance(
    fake: FakeAliyun, make_cloud: Callable[..., AliyunCloud]
) -> None:
    cloud = make_cloud()
    instance = await cloud.launch(job_spec(cloud), [GPU], "spot")
    await cloud.terminate(instance.instance_id, "ft-abc1")
    assert fake.instances[instance.instance_id].status == "Deleted"
    (delete,) = fake.actions("DeleteInstance")
    assert (delete["InstanceId"], delete["Force"].lower()) == (instance.instance_id, "true")
    await cloud.terminate(instance.instance_id, "ft-abc1")  # already gone: fine
    await cloud.terminate("i-bpdoesnotexist00", "ft-abc1")


async def test_terminate_never_deletes_an_instance_not_tagged_for_the_job(
    fake: FakeAliyun, make_cloud: Callable[..., AliyunCloud]
) -> None:
    """A stale effect or a forged report cannot force-delete another job's instance, nor one the bot never made."""
    cloud = make_cloud()
    other = await cloud.launch(job_spec(cloud, "ft-bbbb"), [GPU], "spot")
    stranger = fake._create("cn-hangzhou-j", GPU, "vsw-j", "NoSpot", {"team": "web"}, "", "not-ours", {}).instance_id
    for instance_id, tagged_for in ((other.instance_id, "ft-bbbb"), (stranger, "no job")):
        with pytest.raises(ForeignInstance, match=f"tagged for {tagged_for}, not ft-aaaa"):
            await cloud.terminate(instance_id, "ft-aaaa")
        assert fake.instances[instance_id].status == "Running"
    assert fake.actions("DeleteInstance") == []
    await cloud.terminate(other.instance_id, "ft-bbbb")  # its own job may
    assert fake.instances[other.instance_id].status == "Deleted"


# -- interrupt tests and stops ---------------------------------------------------------------------------------------


async def test_an_interrupt_test_writes_the_runners_control_object_then_releases_after_the_grace(
    fake: FakeAliyun, aws: str, make_cloud: Callable[..., AliyunCloud]
) -> None:
    cloud = make_cloud(interrupt_test_grace_seconds=0.5)
    instance = await cloud.launch(job_spec(cloud, attempt=2), [GPU], "spot")
    before = datetime.now(UTC)
    done = await cloud.interrupt_test(instance.instance_id)
    assert (done.way, done.reference) == ("notice", "oss://ft-oss/jobs/ft-abc1/control/attempt-2.json")

    # The runner's own control-object reader, on its checkpoint prefix, sees a spot notice with that deadline.
    store = oss_store(aws, "jobs/ft-abc1/")
    try:
        (notice,) = await ControlObjectSource(store, attempt=2).poll()
        assert await ControlObjectSource(store, attempt=1).poll() == []  # another attempt is left alone
    finally:
        await store.close()
    assert (notice.kind, notice.source) == ("spot-interruption", "interrupt-test")
    assert notice.deadline is not None
    # now + grace, in whole seconds as ECS writes its termination time (rounded down: never later than the release)
    assert before - timedelta(seconds=1) <= notice.deadline <= before + timedelta(seconds=2)
    assert done.reclaim_at is not None and abs((done.reclaim_at - notice.deadline).total_seconds()) < 1

    assert fake.instances[instance.instance_id].status == "Running"  # not before the grace period is over
    await until(lambda: fake.instances[instance.instance_id].status == "Deleted")
    assert fake.actions("DeleteInstance")[0]["InstanceId"] == instance.instance_id


async def test_closing_the_provider_cancels_a_pending_interrupt_test_release(
    fake: FakeAliyun, make_cloud: Callable[..., AliyunCloud]
) -> None:
    cloud = make_cloud(interrupt_test_grace_seconds=60)
    instance = await cloud.launch(job_spec(cloud), [GPU], "spot")
    await cloud.interrupt_test(instance.instance_id)
    await cloud.close()
    assert fake.actions("DeleteInstance") == []
    assert fake.instances[instance.instance_id].status == "Running"


async def test_interrupt_tests_refuse_instances_not_ours_or_gone(
    fake: FakeAliyun, make_cloud: Callable[..., AliyunCloud]
) -> None:
    cloud = make_cloud()
    with pytest.raises(CloudError, match="does not exist"):
        await cloud.interrupt_test("i-bpnothere0000000")
    instance = await cloud.launch(job_spec(cloud), [GPU], "spot")
    fake.instances[instance.instance_id].tags = {}
    with pytest.raises(CloudError, match="not launched by this bot"):
        await cloud.interrupt_test(instance.instance_id)
    fake.instances[instance.instance_id].tags = {"finetune:job": "ft-abc1", "finetune:attempt": "1"}
    fake.instances[instance.instance_id].status = "Stopped"
    with pytest.raises(CloudError, match="is Stopped"):
        await cloud.interrupt_test(instance.instance_id)


async def test_stop_runner_writes_a_stop_control_object(
    fake: FakeAliyun, aws: str, make_cloud: Callable[..., AliyunCloud]
) -> None:
    cloud = make_cloud()
    instance = await cloud.launch(job_spec(cloud), [GPU], "spot")
    await cloud.stop_runner(instance.instance_id)
    store = oss_store(aws, "jobs/ft-abc1/")
    try:
        (notice,) = await ControlObjectSource(store, attempt=1).poll()
    finally:
        await store.close()
    assert notice.kind == "stop"
    assert fake.instances[instance.instance_id].status == "Running"  # the runner stops; the bot releases later


async def test_save_runner_asks_for_a_fresh_checkpoint_and_stops_nothing(
    fake: FakeAliyun, aws: str, make_cloud: Callable[..., AliyunCloud]
) -> None:
    """A scheduled system event only the bot heard reaches the runner as a save request in its control object."""
    cloud = make_cloud()
    instance = await cloud.launch(job_spec(cloud), [GPU], "spot")
    await cloud.save_runner(instance.instance_id, datetime(2026, 12, 7, 12, tzinfo=UTC))
    store = oss_store(aws, "jobs/ft-abc1/")
    try:
        (notice,) = await ControlObjectSource(store, attempt=1).poll()
    finally:
        await store.close()
    assert notice.kind == "save" and not notice.interrupts
    assert fake.instances[instance.instance_id].status == "Running"


async def test_hand_over_writes_go_where_the_runner_launched_ahead_waits(
    fake: FakeAliyun, aws: str, make_cloud: Callable[..., AliyunCloud]
) -> None:
    cloud = make_cloud()
    await cloud.launch(job_spec(cloud), [GPU], "spot")
    await cloud.hand_over("ft-abc1", 1)
    store = oss_store(aws, "jobs/ft-abc1/")
    try:
        assert await read_go(store, control_key(1))
        assert await ControlObjectSource(store, attempt=1).poll() == []  # go is no notice to a runner that trains
    finally:
        await store.close()


# -- scaling-group mode ---------------------------------------------------------------------------------------


def group_settings(fake: FakeAliyun, groups: int = 1) -> dict[str, Any]:
    ids = [fake.add_group(list(VSWITCHES.values()), [GPU]).group_id for _ in range(groups)]
    return {"mode": "scaling-group", "scaling_groups": ids, "image_id": None}


async def test_scaling_group_launch_sets_desired_one_and_completion_sets_zero(
    fake: FakeAliyun, make_cloud: Callable[..., AliyunCloud]
) -> None:
    fake.no_stock = {"cn-hangzhou-j"}
    cloud = make_cloud(**group_settings(fake), spot_price_limit=4.0)
    (group,) = fake.groups.values()
    instance = await cloud.launch(job_spec(cloud), [GPU, GPU_BIG], "spot")

    assert group.desired == 1
    assert group.instances == [instance.instance_id]
    assert (instance.zone, instance.instance_type, instance.market) == ("cn-hangzhou-k", GPU, "spot")
    assert (instance.price_per_hour, instance.on_demand_price_per_hour) == (2.0, 10.0)
    (modified,) = fake.actions("ModifyScalingConfiguration")
    assert (modified["SpotStrategy"], modified["InstanceTypes.1"], modified["InstanceTypes.2"]) == (
        "SpotWithPriceLimit",
        GPU,
        GPU_BIG,
    )
    assert (modified["SpotPriceLimits.1.InstanceType"], modified["SpotPriceLimits.1.PriceLimit"]) == (GPU, "4.0")
    assert modified["HttpTokens"] == "required"  # the group's instances in the hardened metadata mode too
    configuration = fake.configurations[group.configuration_id]
    assert "FINETUNE_SPEC=oss://ft-oss/jobs/ft-abc1/spec-attempt-1.json\n" in configuration.user_data
    assert fake.instances[instance.instance_id].tags == {
        "finetune:managed": "true",
        "finetune:job": "ft-abc1",
        "finetune:attempt": "1",
    }

    await cloud.terminate(instance.instance_id, "ft-abc1")
    assert group.desired == 0
    assert fake.live() == []  # released, and not replaced
    # A group holds one instance of a job: a switch of market stops first here; instances mode launches ahead.
    assert not launches_ahead(cloud) and launches_ahead(make_cloud())


async def test_a_scaling_group_relaunch_replaces_what_ess_started_from_the_old_attempt(
    fake: FakeAliyun, make_cloud: Callable[..., AliyunCloud]
) -> None:
    cloud = make_cloud(**group_settings(fake))
    (group,) = fake.groups.values()
    first = await cloud.launch(job_spec(cloud), [GPU], "spot")
    assert first.zone == "cn-hangzhou-j"  # the first vSwitch (priority order)
    # ECS reclaims it; ESS replaces it at once from the attempt-1 configuration.
    fake._ecs_DeleteInstance({"InstanceId": first.instance_id, "Force": "true"})
    (replacement,) = group.instances
    assert fake.instances[replacement].tags["finetune:attempt"] == "1"

    second = await cloud.launch(job_spec(cloud, attempt=2), [GPU], "spot", avoid_zones=["cn-hangzhou-j"])
    assert group.instances == [second.instance_id]
    assert fake.instances[replacement].status == "Deleted"  # the stale replacement was scaled in first
    assert fake.instances[second.instance_id].tags["finetune:attempt"] == "2"
    assert second.zone == "cn-hangzhou-k"  # the reclaimed zone's vSwitch went last
    vswitch_orders = [indexed_vswitches(call) for call in fake.actions("ModifyScalingGroup") if "VSwitchIds.1" in call]
    assert vswitch_orders[-1] == ["vsw-k", "vsw-h", "vsw-j"]


def indexed_vswitches(call: dict[str, str]) -> list[str]:
    return [call[f"VSwitchIds.{n}"] for n in range(1, 10) if f"VSwitchIds.{n}" in call]


async def test_each_job_holds_its_own_group_and_a_free_group_is_reused(
    fake: FakeAliyun, make_cloud: Callable[..., AliyunCloud]
) -> None:
    cloud = make_cloud(**group_settings(fake, groups=2))
    first_group, second_group = fake.groups.values()
    a = await cloud.launch(job_spec(cloud, "ft-aaaa"), [GPU], "spot")
    b = await cloud.launch(job_spec(cloud, "ft-bbbb"), [GPU], "spot")
    assert (first_group.instances, second_group.instances) == ([a.instance_id], [b.instance_id])
    with pytest.raises(LaunchError, match=r"every scaling group is busy: .*runs ft-aaaa.*runs ft-bbbb"):
        await cloud.launch(job_spec(cloud, "ft-cccc"), [GPU], "spot")

    await cloud.terminate(a.instance_id, "ft-aaaa")  # ft-aaaa completes
    c = await cloud.launch(job_spec(cloud, "ft-cccc"), [GPU], "spot")
    assert first_group.instances == [c.instance_id]
    assert second_group.instances == [b.instance_id]  # untouched


async def test_a_sold_out_region_fails_the_group_launch_with_the_scaling_activity(
    fake: FakeAliyun, make_cloud: Callable[..., AliyunCloud]
) -> None:
    fake.no_stock = set(ZONES)
    cloud = make_cloud(**group_settings(fake), group_wait_seconds=0.3)
    (group,) = fake.groups.values()
    with pytest.raises(LaunchError, match=r"launched no instance.*OperationDenied\.NoStock"):
        await cloud.launch(job_spec(cloud), [GPU], "spot")
    assert group.desired == 0  # nothing left that could start later, unseen


def test_the_boot_script_never_carries_what_could_break_out_of_it(fake: FakeAliyun, aws: str) -> None:
    with_reports = AliyunCloud(settings(fake, aws, report_url="https://bot.example.com/runner/reports"))
    assert "FINETUNE_REPORT_SECRET" not in with_reports.user_data("oss://ft-oss/x.json", "ft-abc1", 1, SALT)  # no keys
    with pytest.raises(ValueError, match="FINETUNE_SPEC"):
        with_reports.user_data("oss://ft-oss/x.json\nENV\nrm -rf /", "ft-abc1", 1, SALT)


# -- reconciliation: what the cloud lists -------------------------------------------------------------------


async def test_list_instances_finds_every_tagged_instance_across_pages_and_feeds_reconciliation(
    fake: FakeAliyun, make_cloud: Callable[..., AliyunCloud], monkeypatch: pytest.MonkeyPatch
) -> None:
    from bot.cloud.aliyun import instances as aliyun_module
    from handlers.jobs import Attempt, Job, JobState
    from handlers.reconcile import reconcile

    monkeypatch.setattr(aliyun_module, "LIST_PAGE_SIZE", 2)  # five instances: three pages
    cloud = make_cloud()
    kept = await cloud.launch(job_spec(cloud, "ft-abc1", attempt=2), [GPU], "spot")
    old = await cloud.launch(job_spec(cloud, "ft-abc1", attempt=1), [GPU], "spot")
    done = await cloud.launch(job_spec(cloud, "ft-def2", attempt=1), [GPU], "spot")
    released = await cloud.launch(job_spec(cloud, "ft-ghi3", attempt=1), [GPU], "spot")
    await cloud.terminate(released.instance_id, "ft-ghi3")
    fake._create("cn-hangzhou-j", GPU, "vsw-j", "NoSpot", {"team": "web"}, "", "not-ours", {})  # untagged

    before = len(fake.actions("DescribeInstances"))  # each launch looked for its attempt's instance first
    listed = await cloud.list_instances()
    assert {(i.instance_id, i.job_id, i.attempt, i.state) for i in listed} == {
        (kept.instance_id, "ft-abc1", 2, "Running"),
        (old.instance_id, "ft-abc1", 1, "Running"),
        (done.instance_id, "ft-def2", 1, "Running"),
    }
    pages = [call for call in fake.actions("DescribeInstances")[before:] if "InstanceIds" not in call]
    assert [call["PageNumber"] for call in pages] == ["1", "2"] and all(c["Tag.1.Key"] == "finetune:job" for c in pages)

    now = datetime.now(UTC)
    long_ago = now - timedelta(hours=1)
    jobs = [
        Job(
            id="ft-abc1",
            recipe="tiny",
            requested_by="slack:U1",
            state=JobState.RUNNING,
            updated_at=now,
            attempts=[
                Attempt(number=1, instance_id=old.instance_id, launched_at=long_ago, ended_at=long_ago),
                Attempt(number=2, instance_id=kept.instance_id, launched_at=long_ago),
            ],
        ),
        Job(
            id="ft-def2",
            recipe="tiny",
            requested_by="slack:U1",
            state=JobState.SUCCEEDED,
            attempts=[Attempt(number=1, instance_id=done.instance_id, launched_at=long_ago, ended_at=now)],
        ),
        Job(
            id="ft-ghi3",
            recipe="tiny",
            requested_by="slack:U1",
            state=JobState.RUNNING,
            updated_at=now,
            attempts=[Attempt(number=1, instance_id=released.instance_id, launched_at=long_ago)],
        ),
    ]
    actions = {(a.action, a.instance_id) for a in reconcile(jobs, listed, now)}
    assert actions == {
        ("release", old.instance_id),
        ("release", done.instance_id),
        ("instance-gone", released.instance_id),
    }


async def test_list_instances_says_when_the_api_refuses(make_cloud: Callable[..., AliyunCloud]) -> None:
    cloud = make_cloud(access_key_secret="not-the-secret")
    with pytest.raises(CloudError, match="could not list"):
        await cloud.list_instances()


async def test_a_scaling_group_gets_the_chosen_zone_alone_and_the_chosen_market(
    fake: FakeAliyun, make_cloud: Callable[..., AliyunCloud]
) -> None:
    cloud = make_cloud(**group_settings(fake))
    (group,) = fake.groups.values()
    spot = await cloud.launch(job_spec(cloud), [GPU], "spot", zone="cn-hangzhou-h")
    assert (spot.zone, spot.market) == ("cn-hangzhou-h", "spot")
    assert group.vswitches == ["vsw-h"]  # ESS cannot start (or replace) it anywhere else
    assert fake.configurations[group.configuration_id].spot_strategy == "SpotAsPriceGo"

    on_demand = await cloud.launch(job_spec(cloud, attempt=2), [GPU], "on-demand", zone="cn-hangzhou-k")
    assert (on_demand.zone, on_demand.market) == ("cn-hangzhou-k", "on-demand")
    assert group.vswitches == ["vsw-k"]
    assert fake.configurations[group.configuration_id].spot_strategy == "NoSpot"  # no spot mixed in by ESS


async def test_a_scaling_group_refused_in_the_chosen_zone_reports_capacity_for_the_spot_authority(
    fake: FakeAliyun, make_cloud: Callable[..., AliyunCloud]
) -> None:
    fake.no_stock = {"cn-hangzhou-j"}
    cloud = make_cloud(**group_settings(fake), group_wait_seconds=0.3)
    (group,) = fake.groups.values()
    with pytest.raises(LaunchError) as refused:
        await cloud.launch(job_spec(cloud), [GPU], "spot", zone="cn-hangzhou-j")
    assert refused.value.capacity and refused.value.zone == "cn-hangzhou-j"
    assert group.desired == 0 and fake.live() == []  # not moved to another zone, nor to on-demand, by itself


async def test_stock_and_price_history_become_the_zones_availability_cached_per_type(
    fake: FakeAliyun, make_cloud: Callable[..., AliyunCloud]
) -> None:
    fake.stock = {"cn-hangzhou-j": "WithStock", "cn-hangzhou-k": "WithoutStock", "cn-hangzhou-h": "ClosedWithStock"}
    cloud = make_cloud()
    assert await cloud.zone_availability([GPU]) == {"cn-hangzhou-j": 1.0, "cn-hangzhou-k": 0.0, "cn-hangzhou-h": 0.6}
    await cloud.zone_availability([GPU])
    assert len(fake.actions("DescribeAvailableResource")) == 1  # cached

    # The order of a launch weighs the stock first: k is the cheapest, but has none; then the price.
    instance = await cloud.launch(job_spec(cloud), [GPU], "spot")
    assert instance.zone == "cn-hangzhou-j"
    assert [call["ZoneId"] for call in fake.actions("RunInstances")] == ["cn-hangzhou-j"]


async def test_without_stock_information_there_is_no_signal(
    fake: FakeAliyun, make_cloud: Callable[..., AliyunCloud]
) -> None:
    cloud = make_cloud()  # the fake lists no zone: as an account ECS tells nothing
    assert await cloud.zone_availability([GPU]) == {}
    instance = await cloud.launch(job_spec(cloud), [GPU], "spot")
    assert instance.zone == "cn-hangzhou-k"  # the cheapest, as before


# -- gangs: one zone and the job's deployment set -------------------------------------------------------------


def node_spec(cloud: AliyunCloud, attempt: int, node_rank: int, job_id: str = "ft-gang1") -> JobSpec:
    """One node of a two-node gang: its own attempt (as the bot launches them), its rank in the world."""
    gang = Gang(nodes=2, node_rank=node_rank, generation=1, master_addr="192.168.0.10", master_port=29500)
    return job_spec(cloud, job_id, attempt).model_copy(update={"gang": gang})


async def test_two_gang_nodes_launch_into_one_low_latency_deployment_set_and_zone(
    fake: FakeAliyun, make_cloud: Callable[..., AliyunCloud]
) -> None:
    cloud = make_cloud()
    gang = GangPlacement("ft-gang1")
    first = await cloud.launch(node_spec(cloud, 1, 0), [GPU], "spot", gang=gang)
    # The bot pins every node after the first to node 0's zone.
    second = await cloud.launch(node_spec(cloud, 2, 1), [GPU], "spot", zone=first.zone, gang=gang)
    (made,) = fake.deployment_sets.values()
    assert (made.name, made.strategy) == ("finetune-ft-gang1", "LowLatency")
    assert made.instances == [first.instance_id, second.instance_id]
    assert len(fake.actions("CreateDeploymentSet")) == 1  # the second node found the first's set by name
    runs = fake.actions("RunInstances")
    assert [run["DeploymentSetId"] for run in runs] == [made.set_id, made.set_id]
    assert {run["ZoneId"] for run in runs} == {first.zone} == {second.zone}
    # A single-node launch is unchanged: no deployment set.
    await cloud.launch(job_spec(cloud), [GPU], "spot")
    assert "DeploymentSetId" not in fake.actions("RunInstances")[-1]
    assert len(fake.deployment_sets) == 1


async def test_a_deployment_set_made_after_no_answer_is_not_made_twice(
    fake: FakeAliyun, make_cloud: Callable[..., AliyunCloud]
) -> None:
    cloud = make_cloud()
    gang = GangPlacement("ft-gang1")
    await cloud.launch(node_spec(cloud, 1, 0), [GPU], "spot", gang=gang)
    # The same launch carried out again (a crash after CreateDeploymentSet): the set is found, the instance too.
    fake.deployment_sets[next(iter(fake.deployment_sets))].name = "renamed-so-the-lookup-misses"
    await cloud.launch(node_spec(cloud, 1, 0), [GPU], "spot", gang=gang)
    assert len(fake.deployment_sets) == 1  # the client token of the attempt returned the set it made
    assert len(fake.live()) == 1


async def test_release_deletes_the_set_once_its_nodes_are_gone(
    fake: FakeAliyun, make_cloud: Callable[..., AliyunCloud]
) -> None:
    cloud = make_cloud()
    node = await cloud.launch(node_spec(cloud, 1, 0), [GPU], "spot", gang=GangPlacement("ft-gang1"))
    with pytest.raises(CloudError, match="could not delete the deployment set finetune-ft-gang1"):
        await cloud.release_gang_placement("ft-gang1")  # a node still in it: the caller tries again
    assert len(fake.deployment_sets) == 1
    await cloud.terminate(node.instance_id, "ft-gang1")
    await cloud.release_gang_placement("ft-gang1")
    assert fake.deployment_sets == {}
    await cloud.release_gang_placement("ft-gang1")  # gone already
    await cloud.release_gang_placement("ft-never")  # never made
    assert len(fake.actions("DeleteDeploymentSet")) == 2


async def test_a_set_ecs_will_not_make_fails_the_launch_before_any_instance(
    fake: FakeAliyun, make_cloud: Callable[..., AliyunCloud]
) -> None:
    cloud = make_cloud()
    fake.deployment_sets_refused = True
    with pytest.raises(LaunchError, match="could not find or make the deployment set finetune-ft-gang1"):
        await cloud.launch(node_spec(cloud, 1, 0), [GPU], "spot", gang=GangPlacement("ft-gang1"))
    assert fake.actions("RunInstances") == []


async def test_the_scaling_group_mode_refuses_a_gang_and_changes_nothing(
    fake: FakeAliyun, bucket: Any, make_cloud: Callable[..., AliyunCloud]
) -> None:
    cloud = make_cloud(**group_settings(fake))
    with pytest.raises(LaunchError, match=r"gangs need aliyun\.mode instances"):
        await cloud.launch(node_spec(cloud, 1, 0), [GPU], "spot", gang=GangPlacement("ft-gang1"))
    assert bucket.list_objects_v2(Bucket=BUCKET, Prefix="jobs/ft-gang1/").get("KeyCount", 0) == 0
    assert fake.actions("ModifyScalingGroup") == [] and fake.deployment_sets == {}


# -- gangs: where the world meets, and regroups -----------------------------------------------------------------


async def test_node_1_meets_node_0_at_the_private_address_ecs_names_once_assigned(
    fake: FakeAliyun, bucket: Any, make_cloud: Callable[..., AliyunCloud]
) -> None:
    cloud = make_cloud()
    fake.address_delay = 2  # RunInstances names only the id; the address comes in a later DescribeInstances

    async def launch(spec: JobSpec, order: Launch) -> Instance:
        return await cloud.launch(spec, [GPU], "spot", zone=order.zone, gang=GangPlacement("ft-gang1"))

    def spec_of(attempt: int) -> JobSpec:
        return job_spec(cloud, "ft-gang1", attempt)

    job, (node0, node1) = await launch_two_nodes("ft-gang1", spec_of, launch)
    for instance in (node0, node1):
        assert instance.private_ip == fake.instances[instance.instance_id].private_ip
    assert node0.private_ip != node1.private_ip
    assert job.gang_attempts[0].private_ip == node0.private_ip
    raw = bucket.get_object(Bucket=BUCKET, Key="jobs/ft-gang1/spec-attempt-2.json")["Body"].read()
    gang = parse_spec(raw).gang  # what node 1's runner reads
    assert gang is not None and (gang.node_rank, gang.nodes, gang.master_addr) == (1, 2, node0.private_ip)
    # A launch carried out again finds node 0 by its tags, address and all, and starts nothing.
    again = await launch(job_spec(cloud, "ft-gang1", 1), Launch(job_id="ft-gang1", attempt=1))
    assert (again.instance_id, again.private_ip) == (node0.instance_id, node0.private_ip)
    assert len(fake.actions("RunInstances")) == 2


async def test_a_gang_node_whose_address_never_comes_is_launched_without_one(
    fake: FakeAliyun, make_cloud: Callable[..., AliyunCloud]
) -> None:
    cloud = make_cloud(group_wait_seconds=0.2)
    fake.address_delay = 1_000_000
    node = await cloud.launch(node_spec(cloud, 1, 0), [GPU], "spot", gang=GangPlacement("ft-gang1"))
    assert node.private_ip is None  # handlers/gang.py then refuses node 1's place, saying so (a ValueError)
    assert fake.instances[node.instance_id].status == "Running"
    assert len(fake.actions("DescribeInstances")) >= 2  # asked again before giving up


def regroup(generation: int, node_rank: int) -> RegroupControl:
    gang = Gang(nodes=2, node_rank=node_rank, generation=generation, master_addr="192.168.0.10", master_port=29500)
    return RegroupControl(gang=gang)


async def test_a_regroup_goes_to_oss_where_the_nodes_runner_reads_it(
    fake: FakeAliyun, aws: str, bucket: Any, make_cloud: Callable[..., AliyunCloud]
) -> None:
    cloud = make_cloud()
    await cloud.launch(node_spec(cloud, 2, 1), [GPU], "spot", gang=GangPlacement("ft-gang1"))
    control = regroup(generation=2, node_rank=0)
    await cloud.write_node_control("ft-gang1", 2, 2, 1, control)
    listed = bucket.list_objects_v2(Bucket=BUCKET, Prefix="jobs/ft-gang1/control/").get("Contents", [])
    assert [item["Key"] for item in listed] == ["jobs/ft-gang1/control/attempt-2/generation-2/node-1.json"]
    store = oss_store(aws, "jobs/ft-gang1/")  # the runner's store, at its spec's checkpoint_uri
    try:
        assert await read_regroup(store, node_control_key(2, 2, 1)) == control
    finally:
        await store.close()


async def test_a_regroup_for_an_attempt_without_a_live_instance_is_refused_and_writes_nothing(
    fake: FakeAliyun, bucket: Any, make_cloud: Callable[..., AliyunCloud]
) -> None:
    cloud = make_cloud()
    node = await cloud.launch(node_spec(cloud, 1, 0), [GPU], "spot", gang=GangPlacement("ft-gang1"))
    with pytest.raises(CloudError, match="no live instance is tagged for ft-other attempt 1"):
        await cloud.write_node_control("ft-other", 1, 1, 0, regroup(2, 0))  # another job's attempt 1: none
    with pytest.raises(CloudError, match="no live instance is tagged for ft-gang1 attempt 7"):
        await cloud.write_node_control("ft-gang1", 7, 1, 0, regroup(2, 0))  # an attempt this job never had
    await cloud.terminate(node.instance_id, "ft-gang1")
    with pytest.raises(CloudError, match="no live instance is tagged for ft-gang1 attempt 1"):
        await cloud.write_node_control("ft-gang1", 1, 1, 0, regroup(2, 0))  # its instance is released
    for prefix in ("jobs/ft-other/", "jobs/ft-gang1/control/"):
        assert bucket.list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("KeyCount", 0) == 0

"""A gang's nodes on AWS (moto in server mode behind tests/aws_fakes.py's proxy, which plays the placement groups
moto lacks): one cluster placement group per job, every node in it and in one zone, EFA where the type has it; node 1
told to meet node 0 at the private address EC2 gave it; a regroup written where the node's runner reads it."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

import bot.cloud.base as cloud_base
from bot.cloud.aws.placement import placement_group_name
from bot.cloud.aws.provider import AwsCloud
from bot.cloud.base import GangPlacement, Instance, LaunchError
from bot.errors import CloudError
from handlers.messages import Launch
from handlers.spec import Gang, JobSpec, RegroupControl, node_control_key, parse_spec
from runner.notices.control import read_regroup
from runner.storage.s3 import S3Store
from tests.aws_fakes import Ec2Proxy
from tests.gang_launches import launch_two_nodes
from tests.test_aws_cloud import ZONE_IDS, World, build_world, job_spec

JOB = "ft-gang1"


@pytest.fixture(name="world")
def fixture_world(aws: str) -> World:
    return build_world(aws)


@pytest.fixture(name="proxy")
async def fixture_proxy(world: World, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Ec2Proxy]:
    """Every EC2 call of the provider goes through the proxy, which plays the placement groups moto lacks."""
    monkeypatch.setattr(cloud_base, "_logged_once", set())  # each test sees its own "said once"
    started = await Ec2Proxy(world.endpoint).start()
    monkeypatch.setenv("AWS_ENDPOINT_URL_EC2", started.endpoint)
    yield started
    await started.stop()


@pytest.fixture(name="make_cloud")
async def fixture_make_cloud(world: World, proxy: Ec2Proxy) -> AsyncIterator[Callable[..., AwsCloud]]:
    clouds: list[AwsCloud] = []

    def make(**changes: Any) -> AwsCloud:
        clouds.append(AwsCloud(world.settings(**changes)))
        return clouds[-1]

    yield make
    for cloud in clouds:
        await cloud.close()


def node_spec(cloud: AwsCloud, attempt: int, node_rank: int) -> JobSpec:
    """One node of a two-node gang: its own attempt (as the bot launches them), its rank in the world."""
    gang = Gang(nodes=2, node_rank=node_rank, generation=1, master_addr="10.0.0.10", master_port=29500)
    return job_spec(cloud, JOB, attempt).model_copy(update={"gang": gang})


def run_forms(proxy: Ec2Proxy) -> list[dict[str, str]]:
    return proxy.actions("RunInstances")


async def test_two_gang_nodes_launch_into_one_placement_group_and_zone(
    world: World, proxy: Ec2Proxy, make_cloud: Any
) -> None:
    cloud: AwsCloud = make_cloud()
    gang = GangPlacement(JOB)
    first = await cloud.launch(node_spec(cloud, 1, 0), ["g5.xlarge"], "spot", gang=gang)
    # The bot pins every node after the first to node 0's zone.
    second = await cloud.launch(node_spec(cloud, 2, 1), ["g5.xlarge"], "spot", zone=first.zone, gang=gang)
    name = placement_group_name(JOB)
    assert list(proxy.placement_groups) == [name]
    group = proxy.placement_groups[name]
    assert group.strategy == "cluster"
    assert group.tags == {"finetune:managed": "true", "finetune:job": JOB}
    assert len(proxy.actions("CreatePlacementGroup")) == 2  # the second found the first's: fine
    forms = run_forms(proxy)
    assert [form["Placement.GroupName"] for form in forms] == [name, name]
    assert {form["Placement.AvailabilityZone"] for form in forms} == {first.zone}
    for instance in (first, second):
        assert world.instance(instance.instance_id)["Placement"]["AvailabilityZone"] == first.zone
    assert not any(key.startswith("NetworkInterface") for form in forms for key in form)  # no efa asked


async def test_efa_for_a_type_that_has_it(world: World, proxy: Ec2Proxy, make_cloud: Any) -> None:
    cloud: AwsCloud = make_cloud()
    gang = GangPlacement(JOB, efa=True)
    await cloud.launch(node_spec(cloud, 1, 0), ["p5.48xlarge"], "on-demand", zone="us-east-1b", gang=gang)
    (form,) = run_forms(proxy)
    assert form["NetworkInterface.1.InterfaceType"] == "efa"
    assert form["NetworkInterface.1.DeviceIndex"] == "0"
    # The subnet and security groups move into the interface: EC2 refuses them beside NetworkInterfaces.
    assert form["NetworkInterface.1.SubnetId"] == world.subnets["us-east-1b"]
    assert form["NetworkInterface.1.SecurityGroupId.1"] == world.security_group
    assert "SubnetId" not in form and "SecurityGroupId.1" not in form
    assert form["Placement.GroupName"] == placement_group_name(JOB)


async def test_no_efa_for_a_type_without_it_said_once(
    world: World, proxy: Ec2Proxy, make_cloud: Any, caplog: pytest.LogCaptureFixture
) -> None:
    cloud: AwsCloud = make_cloud()
    gang = GangPlacement(JOB, efa=True)
    with caplog.at_level(logging.WARNING, logger="bot.cloud.aws.placement"):
        first = await cloud.launch(node_spec(cloud, 1, 0), ["g5.xlarge"], "spot", gang=gang)
        await cloud.launch(node_spec(cloud, 2, 1), ["g5.xlarge"], "spot", zone=first.zone, gang=gang)
    for form in run_forms(proxy):
        assert not any(key.startswith("NetworkInterface") for key in form)
        assert form["SubnetId"] == world.subnets[first.zone]
        assert form["Placement.GroupName"] == placement_group_name(JOB)
    assert [r.getMessage() for r in caplog.records if "no EFA" in r.getMessage()] == [
        "g5.xlarge has no EFA: gang nodes of this type launch without an EFA interface (efa=true asked for one)"
    ]
    assert len(proxy.actions("DescribeInstanceTypes")) == 1  # asked once per type


async def test_efa_unknown_is_a_launch_error_not_a_guess(proxy: Ec2Proxy, make_cloud: Any) -> None:
    cloud: AwsCloud = make_cloud()
    proxy.denied_actions.add("DescribeInstanceTypes")
    with pytest.raises(LaunchError, match=r"would not say whether g5\.xlarge has EFA"):
        await cloud.launch(node_spec(cloud, 1, 0), ["g5.xlarge"], "spot", gang=GangPlacement(JOB, efa=True))
    assert run_forms(proxy) == []


async def test_release_deletes_the_group_and_gone_is_fine(proxy: Ec2Proxy, make_cloud: Any) -> None:
    cloud: AwsCloud = make_cloud()
    await cloud.launch(node_spec(cloud, 1, 0), ["g5.xlarge"], "spot", gang=GangPlacement(JOB))
    assert placement_group_name(JOB) in proxy.placement_groups
    await cloud.release_gang_placement(JOB)
    assert proxy.placement_groups == {}
    await cloud.release_gang_placement(JOB)  # gone already
    await cloud.release_gang_placement("ft-never")  # never made
    assert len(proxy.actions("DeletePlacementGroup")) == 3


async def test_a_group_ec2_will_not_make_fails_the_launch_before_any_instance(proxy: Ec2Proxy, make_cloud: Any) -> None:
    cloud: AwsCloud = make_cloud()
    proxy.denied_actions.add("CreatePlacementGroup")
    with pytest.raises(LaunchError, match=f"could not make the placement group {placement_group_name(JOB)}"):
        await cloud.launch(node_spec(cloud, 1, 0), ["g5.xlarge"], "spot", gang=GangPlacement(JOB))
    assert run_forms(proxy) == []


async def test_a_single_node_launch_is_unchanged(proxy: Ec2Proxy, make_cloud: Any) -> None:
    cloud: AwsCloud = make_cloud()
    await cloud.launch(job_spec(cloud), ["g5.xlarge"], "spot")
    (form,) = run_forms(proxy)
    assert "Placement.GroupName" not in form
    assert not any(key.startswith("NetworkInterface") for key in form)
    assert proxy.actions("CreatePlacementGroup") == [] and proxy.actions("DescribeInstanceTypes") == []


async def test_auto_scaling_mode_refuses_a_gang_and_changes_nothing(
    world: World, proxy: Ec2Proxy, make_cloud: Any
) -> None:
    cloud: AwsCloud = make_cloud(mode="autoscaling")
    with pytest.raises(LaunchError, match=r"gangs need aws\.mode instance"):
        await cloud.launch(node_spec(cloud, 1, 0), ["g5.xlarge"], "spot", gang=GangPlacement(JOB))
    assert world.keys_under(f"jobs/{JOB}/") == []
    assert proxy.placement_groups == {}
    assert world.asg.describe_auto_scaling_groups()["AutoScalingGroups"] == []


# -- where the gang meets, and its regroups -------------------------------------------------------------------


async def test_node_1_meets_node_0_at_the_private_address_ec2_gave_it(
    world: World, proxy: Ec2Proxy, make_cloud: Any
) -> None:
    cloud: AwsCloud = make_cloud()

    async def launch(spec: JobSpec, order: Launch) -> Instance:
        return await cloud.launch(spec, ["g5.xlarge"], "spot", zone=order.zone, gang=GangPlacement(JOB))

    job, (node0, node1) = await launch_two_nodes(JOB, lambda attempt: job_spec(cloud, JOB, attempt), launch)
    for instance in (node0, node1):  # from RunInstances' own reply
        assert instance.private_ip == world.instance(instance.instance_id)["PrivateIpAddress"]
    assert node0.private_ip != node1.private_ip
    assert job.gang_attempts[0].private_ip == node0.private_ip  # the job keeps where its world meets
    spec = parse_spec(world.object(f"jobs/{JOB}/spec-attempt-2.json"))  # what node 1's runner reads
    assert spec.gang is not None
    assert (spec.gang.node_rank, spec.gang.nodes, spec.gang.master_addr) == (1, 2, node0.private_ip)
    # A launch carried out again finds node 0 by its tags, address and all, and starts nothing.
    again = await launch(job_spec(cloud, JOB, 1), Launch(job_id=JOB, attempt=1))
    assert (again.instance_id, again.private_ip) == (node0.instance_id, node0.private_ip)
    assert len(run_forms(proxy)) == 2


def regroup(generation: int, node_rank: int) -> RegroupControl:
    gang = Gang(nodes=2, node_rank=node_rank, generation=generation, master_addr="10.0.0.10", master_port=29500)
    return RegroupControl(gang=gang)


async def test_a_regroup_goes_where_the_nodes_runner_reads_it(world: World, proxy: Ec2Proxy, make_cloud: Any) -> None:
    cloud: AwsCloud = make_cloud()
    await cloud.launch(node_spec(cloud, 2, 1), ["g5.xlarge"], "spot", gang=GangPlacement(JOB))
    control = regroup(generation=2, node_rank=0)  # node 1 of generation 2 becomes rank 0 of generation 3
    await cloud.write_node_control(JOB, 2, 2, 1, control)
    assert world.keys_under(f"jobs/{JOB}/control/") == [f"jobs/{JOB}/control/attempt-2/generation-2/node-1.json"]
    store = S3Store(cloud.checkpoint_uri(JOB))  # the runner's store, at its spec's checkpoint_uri
    try:
        assert await read_regroup(store, node_control_key(2, 2, 1)) == control
    finally:
        await store.close()


async def test_a_regroup_for_an_attempt_without_a_live_instance_is_refused_and_writes_nothing(
    world: World, proxy: Ec2Proxy, make_cloud: Any
) -> None:
    cloud: AwsCloud = make_cloud()
    node = await cloud.launch(node_spec(cloud, 1, 0), ["g5.xlarge"], "spot", gang=GangPlacement(JOB))
    with pytest.raises(CloudError, match="no live instance is tagged for ft-other attempt 1"):
        await cloud.write_node_control("ft-other", 1, 1, 0, regroup(2, 0))  # another job's attempt 1: none
    with pytest.raises(CloudError, match=f"no live instance is tagged for {JOB} attempt 7"):
        await cloud.write_node_control(JOB, 7, 1, 0, regroup(2, 0))  # an attempt this job never had
    await cloud.terminate(node.instance_id, JOB)
    with pytest.raises(CloudError, match=f"no live instance is tagged for {JOB} attempt 1"):
        await cloud.write_node_control(JOB, 1, 1, 0, regroup(2, 0))  # its instance is gone
    assert world.keys_under("jobs/ft-other/") == []
    assert world.keys_under(f"jobs/{JOB}/control/") == []


async def test_a_gangs_zones_are_scored_for_every_node_at_once(world: World, proxy: Ec2Proxy, make_cloud: Any) -> None:
    # Before: every placement score was asked for one instance, which says little of whether a zone has room for
    # all of a gang's nodes; the zone a gang's node 0 goes to is ordered by the score for the whole gang.
    proxy.placement_scores = {ZONE_IDS["us-east-1a"]: 2, ZONE_IDS["us-east-1b"]: 8}
    cloud: AwsCloud = make_cloud()
    first = await cloud.launch(node_spec(cloud, 1, 0), ["g5.xlarge"], "spot", gang=GangPlacement(JOB))
    assert first.zone == "us-east-1b"
    [asked] = proxy.actions("GetSpotPlacementScores")
    assert asked["TargetCapacity"] == "2" and asked["SingleAvailabilityZone"] == "true"

"""deploy/aliyun/finetune.ros.yaml: valid YAML in ROS's format, every reference resolves, and the pieces the bot relies
on are there and wired to each other (there is no cfn-lint for ROS, so this is its lint)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from bot.sources.aliyun_http import EVENTBRIDGE_PATH, TOKEN_HEADER
from handlers.aliyun_events import ECS_SOURCE, INTERRUPTION, STATE_CHANGE, parse_eventbridge
from tests.aliyun_payloads import cloudevent, system_event_content

TEMPLATE = Path(__file__).resolve().parent.parent / "deploy" / "aliyun" / "finetune.ros.yaml"
PSEUDO = {"ALIYUN::NoValue", "ALIYUN::Region", "ALIYUN::AccountId", "ALIYUN::StackName", "ALIYUN::StackId"}


@pytest.fixture(scope="module")
def template() -> dict[str, Any]:
    document = yaml.safe_load(TEMPLATE.read_text())
    assert isinstance(document, dict)
    return document


def walk(node: Any) -> Iterator[tuple[str, Any]]:
    """Every (function name, argument) of ``Ref`` / ``Fn::*`` anywhere in the tree."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "Ref" or key.startswith("Fn::"):
                yield key, value
            yield from walk(value)
    elif isinstance(node, list):
        for item in node:
            yield from walk(item)


def resource(template: dict[str, Any], name: str, kind: str) -> dict[str, Any]:
    found = template["Resources"][name]
    assert found["Type"] == kind
    properties: dict[str, Any] = found["Properties"]
    return properties


def test_the_format_version_and_every_reference_resolve(template: dict[str, Any]) -> None:
    assert template["ROSTemplateFormatVersion"] == "2015-09-01"
    parameters, resources = set(template["Parameters"]), set(template["Resources"])
    conditions = set(template.get("Conditions", {}))
    assert not parameters & resources
    functions = list(walk(template))
    assert functions  # the walk sees the template's functions
    for name, argument in functions:
        if name == "Ref":
            assert argument in parameters | resources | PSEUDO, f"Ref {argument} resolves to nothing"
        elif name == "Fn::GetAtt":
            assert argument[0] in resources, f"GetAtt of unknown resource {argument[0]}"
        elif name == "Fn::If":
            assert argument[0] in conditions, f"If on unknown condition {argument[0]}"
    for name, body in template["Resources"].items():
        assert body["Type"].startswith("ALIYUN::"), name
        for dependency in [body["DependsOn"]] if isinstance(body.get("DependsOn"), str) else body.get("DependsOn", []):
            assert dependency in resources


def test_the_scaling_group_spans_two_zones_of_one_vpc(template: dict[str, Any]) -> None:
    group = resource(template, "ScalingGroup", "ALIYUN::ESS::ScalingGroup")
    switches = [item["Ref"] for item in group["VSwitchIds"]]
    assert len(switches) >= 2
    zones = {resource(template, name, "ALIYUN::ECS::VSwitch")["ZoneId"]["Ref"] for name in switches}
    assert len(zones) == len(switches)  # one vSwitch per zone
    assert {resource(template, name, "ALIYUN::ECS::VSwitch")["VpcId"]["Ref"] for name in switches} == {"Vpc"}
    # Desired capacity must be set at creation for ESS to accept it later; 0 until the bot starts a job.
    assert (group["MinSize"], group["MaxSize"], group["DesiredCapacity"]) == (0, 1, 0)
    assert group["MultiAZPolicy"] == "PRIORITY"  # the bot orders the vSwitches: a reclaimed zone goes last
    assert group["SpotInstanceRemedy"] is False


def test_the_scaling_configuration_launches_preemptible_runners_with_the_bucket_role(template: dict[str, Any]) -> None:
    configuration = resource(template, "ScalingConfiguration", "ALIYUN::ESS::ScalingConfiguration")
    assert configuration["ScalingGroupId"] == {"Ref": "ScalingGroup"}
    assert configuration["SpotStrategy"]["Fn::If"][1:] == ["SpotWithPriceLimit", "SpotAsPriceGo"]
    assert configuration["SpotPriceLimit"]["Fn::If"][1] == {"Ref": "SpotPriceLimit"}
    assert configuration["ImageId"] == {"Ref": "ImageId"}
    assert configuration["SecurityGroupId"] == {"Ref": "SecurityGroup"}
    home, other = configuration["RamRoleName"]["Fn::If"][1:]
    assert home == {"Fn::GetAtt": ["RunnerRole", "RoleName"]}
    assert other == resource(template, "RunnerRole", "ALIYUN::RAM::Role")["RoleName"]  # the home stack's, by name
    assert configuration["InternetMaxBandwidthOut"] == 0
    enable = resource(template, "ScalingGroupEnable", "ALIYUN::ESS::ScalingGroupEnable")
    assert enable == {
        "ScalingGroupId": {"Ref": "ScalingGroup"},
        "ScalingConfigurationId": {"Ref": "ScalingConfiguration"},
    }


def test_the_runner_role_is_for_ecs_and_reaches_only_its_key_objects(template: dict[str, Any]) -> None:
    role = resource(template, "RunnerRole", "ALIYUN::RAM::Role")
    (trust,) = role["AssumeRolePolicyDocument"]["Statement"]
    assert trust["Principal"]["Service"] == ["ecs.aliyuncs.com"]
    (policy,) = role["Policies"]
    allow, deny = policy["PolicyDocument"]["Statement"]
    assert (allow["Effect"], allow["Action"]) == ("Allow", ["oss:GetObject"])
    assert [arn["Fn::Join"][1][2] for arn in allow["Resource"]] == ["/attempt-keys/*"]
    assert (deny["Effect"], deny["Action"]) == ("Deny", ["oss:*"])
    assert [arn["Fn::Join"][1][2] for arn in deny["Resource"]] == ["/jobs/*"]


def test_the_runner_storage_role_splits_objects_by_kind(template: dict[str, Any]) -> None:
    role = resource(template, "RunnerStorageRole", "ALIYUN::RAM::Role")
    (policy,) = role["Policies"]
    statements = policy["PolicyDocument"]["Statement"]
    for statement in statements:
        assert all(action.startswith("oss:") and action != "oss:*" for action in statement["Action"])
        for arn in statement["Resource"]:
            assert arn["Fn::Join"][1][:2] == ["acs:oss:*:*:", {"Ref": "BucketName"}]
    # Writes reach checkpoints and outputs only; specs and control objects are denied outright.
    writes = [s for s in statements if s["Effect"] == "Allow" and "oss:PutObject" in s["Action"]]
    assert [arn["Fn::Join"][1][2] for s in writes for arn in s["Resource"]] == [
        "/jobs/*/checkpoint-*",
        "/jobs/*/output/*",
        "/jobs/*/COMPLETED.json",
    ]
    (deny,) = [s for s in statements if s["Effect"] == "Deny"]
    assert {"oss:PutObject", "oss:DeleteObject"} <= set(deny["Action"])
    assert [arn["Fn::Join"][1][2] for arn in deny["Resource"]] == ["/jobs/*/spec-attempt-*", "/jobs/*/control/*"]
    assert resource(template, "CheckpointBucket", "ALIYUN::OSS::Bucket")["AccessControl"] == "private"


def test_eventbridge_pushes_interruptions_over_https_with_the_token_in_a_header(template: dict[str, Any]) -> None:
    rule = resource(template, "InterruptionRule", "ALIYUN::EventBridge::Rule")
    assert rule["EventBusName"] == "default" and rule["Status"] == "ENABLE"
    assert rule["FilterPattern"]["source"] == [ECS_SOURCE]
    types = rule["FilterPattern"]["type"]
    assert {f"ecs:{INTERRUPTION}", f"ecs:{STATE_CHANGE}"} == {kind for kind in types if isinstance(kind, str)}
    # Scheduled O&M events by prefix (their type ends in the event's status): each reaches the bot as an early signal.
    prefixes = [kind["prefix"] for kind in types if isinstance(kind, dict)]
    assert sorted(prefixes) == ["ecs:Instance:SystemFailure.", "ecs:Instance:SystemMaintenance."]
    for prefix in prefixes:
        name = prefix.removeprefix("ecs:") + "Reboot:Scheduled"
        pushed = cloudevent(name, system_event_content("i-bp1ecr0000005go2go"), "i-bp1ecr0000005go2go")
        (event,) = parse_eventbridge(json.dumps(pushed), datetime(2026, 3, 1, tzinfo=UTC))
        assert event.kind == "scheduled-event"
    (target,) = rule["Targets"]
    assert target["Type"] == "https" and target["Endpoint"] == {"Fn::Sub": "${BotWebhookUrl}" + EVENTBRIDGE_PATH}
    params = {param["ResourceKey"]: param for param in target["ParamList"]}
    assert params["url"]["Value"] == target["Endpoint"] and params["Body"]["Form"] == "ORIGINAL"
    # The token in a header, never in the URL (bot.sources.aliyun_http refuses that, and plain http).
    header = params["HeaderParameters"]["Value"]["Fn::Sub"]
    example = json.loads(header.replace("${WebhookToken}", "t" * 16))
    assert example == {TOKEN_HEADER: "t" * 16}
    assert not any("token" in json.dumps(value).lower() for value in (target["Endpoint"], params["url"]))
    token = template["Parameters"]["WebhookToken"]
    assert token["NoEcho"] is True and token["MinLength"] >= 16
    assert re.fullmatch(token["AllowedPattern"], "a" * 16) and not re.fullmatch(token["AllowedPattern"], 'a"b')
    url = template["Parameters"]["BotWebhookUrl"]["AllowedPattern"]
    assert re.match(url, "https://bot.example.com") and not re.match(url, "http://bot.example.com")
    assert not [name for name, body in template["Resources"].items() if body["Type"].startswith("ALIYUN::CMS::")]


def test_the_bot_policy_covers_what_the_provider_calls(template: dict[str, Any]) -> None:
    policy = resource(template, "BotPolicy", "ALIYUN::RAM::ManagedPolicy")
    actions = {action for statement in policy["PolicyDocument"]["Statement"] for action in _list(statement["Action"])}
    cloud = Path(__file__).resolve().parent.parent / "bot" / "cloud"
    source = "".join(module.read_text() for module in sorted(cloud.glob("aliyun/*.py")))
    called = {
        "describe_regions": "ecs:DescribeRegions",
        "run_instances": "ecs:RunInstances",
        "describe_instances": "ecs:DescribeInstances",
        "delete_instance": "ecs:DeleteInstance",
        "describe_spot_price_history": "ecs:DescribeSpotPriceHistory",
        "describe_price": "ecs:DescribePrice",
        "describe_available_resource": "ecs:DescribeAvailableResource",
        "create_deployment_set": "ecs:CreateDeploymentSet",
        "describe_deployment_sets": "ecs:DescribeDeploymentSets",
        "delete_deployment_set": "ecs:DeleteDeploymentSet",
        "describe_scaling_groups": "ess:DescribeScalingGroups",
        "describe_scaling_configurations": "ess:DescribeScalingConfigurations",
        "describe_scaling_instances": "ess:DescribeScalingInstances",
        "describe_scaling_activities": "ess:DescribeScalingActivities",
        "modify_scaling_group": "ess:ModifyScalingGroup",
        "modify_scaling_configuration": "ess:ModifyScalingConfiguration",
    }
    for snake, action in called.items():
        assert f'"{snake}"' in source, f"the provider no longer calls {snake}: update this test"
        assert action in actions, f"{action} missing from the bot's policy"
    assert {"ram:PassRole", "oss:PutObject"} <= actions


def _list(value: str | list[str]) -> list[str]:
    return [value] if isinstance(value, str) else value


HOME_ONLY = {"CheckpointBucket", "RunnerRole", "RunnerStorageRole", "BotPolicy"}


def made_in(template: dict[str, Any], region: str, home_region: str) -> dict[str, Any]:
    """The resources and outputs ROS makes in ``region`` for HomeRegion ``home_region``: the conditions evaluated
    (the template's own, which use Fn::Or, Fn::Equals, Fn::Not and Condition), resources and outputs of a false one
    left out, each Fn::If replaced by its branch (ALIYUN::NoValue: nothing)."""
    parameters = {name: spec.get("Default") for name, spec in template["Parameters"].items()}
    parameters["HomeRegion"] = home_region
    truths: dict[str, bool] = {}

    def value(node: Any) -> Any:
        if isinstance(node, dict) and "Ref" in node:
            return region if node["Ref"] == "ALIYUN::Region" else parameters[node["Ref"]]
        return node

    def holds(node: Any) -> bool:
        ((name, argument),) = node.items()
        if name == "Condition":
            return truth(argument)
        if name == "Fn::Equals":
            return bool(value(argument[0]) == value(argument[1]))
        if name == "Fn::Not":
            return not holds(argument)
        if name == "Fn::Or":
            return any(holds(item) for item in argument)
        raise AssertionError(f"no evaluation of {name}")

    def truth(name: str) -> bool:
        if name not in truths:
            truths[name] = holds(template["Conditions"][name])
        return truths[name]

    def chosen(node: Any) -> Any:
        if isinstance(node, list):
            return [item for item in (chosen(item) for item in node) if item is not None]
        if not isinstance(node, dict):
            return node
        if node == {"Ref": "ALIYUN::NoValue"}:
            return None
        if list(node) == ["Fn::If"]:
            name, then, otherwise = node["Fn::If"]
            return chosen(then if truth(name) else otherwise)
        return {key: chosen(item) for key, item in node.items()}

    return {
        section: {
            name: chosen(body)
            for name, body in template[section].items()
            if "Condition" not in body or truth(body["Condition"])
        }
        for section in ("Resources", "Outputs")
    }


@pytest.mark.parametrize("home_region", ["", "cn-hangzhou"])
def test_the_home_region_makes_the_whole_stack(template: dict[str, Any], home_region: str) -> None:
    made = made_in(template, "cn-hangzhou", home_region)
    assert set(made["Resources"]) >= HOME_ONLY and "RegionBotPolicy" not in made["Resources"]
    assert {"BucketName", "RunnerRoleName", "RunnerStorageRoleArn"} <= set(made["Outputs"])


def test_another_region_makes_its_network_scaling_group_and_a_rule_to_the_same_webhook(
    template: dict[str, Any],
) -> None:
    """cn-shanghai for a bot at home in cn-hangzhou: no bucket and no RAM role or policy of the account's again; its
    scaling group launches with the home stack's runner role; its EventBridge rule pushes this region's events to
    the same webhook with the same token as the home stack's; a policy for its own scaling group only."""
    home = made_in(template, "cn-hangzhou", "cn-hangzhou")
    made = made_in(template, "cn-shanghai", "cn-hangzhou")
    assert not HOME_ONLY & set(made["Resources"])
    assert set(home["Resources"]) - set(made["Resources"]) == HOME_ONLY
    assert set(made["Resources"]) - set(home["Resources"]) == {"RegionBotPolicy"}
    left = set(made["Resources"])
    for name, argument in walk(made):  # nothing made here refers to what only the home stack makes
        if name == "Ref":
            assert argument in set(template["Parameters"]) | left | PSEUDO, f"Ref {argument} is not made here"
        elif name == "Fn::GetAtt":
            assert argument[0] in left, f"GetAtt of {argument[0]}, which is not made here"
        elif name == "Fn::Sub":
            assert not {ref for ref in re.findall(r"\$\{([^}.]+)", argument) if ref in HOME_ONLY}, argument
    runner_role = made["Resources"]["ScalingConfiguration"]["Properties"]["RamRoleName"]
    assert runner_role == template["Resources"]["RunnerRole"]["Properties"]["RoleName"]
    assert made["Resources"]["InterruptionRule"] == home["Resources"]["InterruptionRule"]  # one webhook, one token
    assert "BucketName" not in made["Outputs"] and "ScalingGroupId" in made["Outputs"]
    policy = made["Resources"]["RegionBotPolicy"]["Properties"]
    (statement,) = policy["PolicyDocument"]["Statement"]
    assert [arn["Fn::Sub"].split("/")[-1] for arn in statement["Resource"]] == [
        "${ScalingGroup}",
        "${ScalingConfiguration}",
    ]
    home_policy = template["Resources"]["BotPolicy"]["Properties"]["PolicyName"]
    assert policy["PolicyName"] == {"Fn::Sub": "finetune-bot-${ALIYUN::Region}"} != home_policy  # RAM names are global

"""deploy/aliyun/bot.ros.yaml, checked as tests/test_aliyun_ros.py checks the runner stack (there is no cfn-lint for
ROS): every reference resolves, the pieces are wired to each other and to the runner stack's outputs, and what the
boot script writes is a configuration the bot accepts, reachable by CloudMonitor's webhook."""

from __future__ import annotations

import asyncio
import os
import re
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from bot.cloud.local.metadata import LocalMetadataServer
from bot.http import REPORTS_PATH
from bot.redis_server import check_redis_url
from bot.settings import Settings, parse_file_config
from bot.sources.aliyun_http import CLOUDMONITOR_PATH, EVENTBRIDGE_PATH
from tests.aliyun_fakes import ACCESS_KEY_ID, ACCESS_KEY_SECRET, FakeAliyun
from tests.test_aliyun_ros import PSEUDO, resource, walk

DEPLOY = Path(__file__).resolve().parent.parent / "deploy" / "aliyun"
# Bot-stack parameter -> the runner-stack output it is given (docs/aliyun.md).
FROM_RUNNER_STACK = {
    "VpcId": "VpcId",
    "ZoneId1": "ZoneId1",
    "ZoneId2": "ZoneId2",
    "BucketName": "BucketName",
    "RunnerVSwitch1": "VSwitch1",
    "RunnerVSwitch2": "VSwitch2",
    "RunnerSecurityGroupId": "SecurityGroupId",
    "RunnerRoleName": "RunnerRoleName",
}
_SUB = re.compile(r"\$\{([^}!][^}]*)\}")


@pytest.fixture(scope="module")
def template() -> dict[str, Any]:
    document = yaml.safe_load((DEPLOY / "bot.ros.yaml").read_text())
    assert isinstance(document, dict)
    return document


@pytest.fixture(scope="module")
def runner() -> dict[str, Any]:
    document = yaml.safe_load((DEPLOY / "finetune.ros.yaml").read_text())
    assert isinstance(document, dict)
    return document


def test_every_reference_resolves(template: dict[str, Any]) -> None:
    assert template["ROSTemplateFormatVersion"] == "2015-09-01"
    parameters, resources = set(template["Parameters"]), set(template["Resources"])
    assert not parameters & resources
    functions = list(walk(template))
    subs = [argument for name, argument in functions if name == "Fn::Sub"]
    assert subs
    for name, argument in functions:
        if name == "Ref":
            assert argument in parameters | resources | PSEUDO, f"Ref {argument} resolves to nothing"
        elif name == "Fn::GetAtt":
            assert argument[0] in resources, f"GetAtt of unknown resource {argument[0]}"
    for text in subs:
        for match in _SUB.finditer(text):
            logical = match.group(1).split(".")[0]
            assert logical in parameters | resources | PSEUDO, f"${{{match.group(1)}}} resolves to nothing"
    for name, body in template["Resources"].items():
        assert body["Type"].startswith("ALIYUN::"), name


def test_it_takes_the_runner_stacks_outputs(template: dict[str, Any], runner: dict[str, Any]) -> None:
    for parameter, output in FROM_RUNNER_STACK.items():
        assert parameter in template["Parameters"] and output in runner["Outputs"], (parameter, output)
    role = resource(template, "BotRolePolicy", "ALIYUN::RAM::AttachPolicyToRole")
    assert role["PolicyName"] == resource(runner, "BotPolicy", "ALIYUN::RAM::ManagedPolicy")["PolicyName"]
    assert role["RoleName"] == {"Fn::GetAtt": ["BotRole", "RoleName"]}
    # The bot's webhook output is what the runner stack's BotWebhookUrl accepts, for CloudMonitor to push to.
    pattern = runner["Parameters"]["BotWebhookUrl"]["AllowedPattern"]
    assert re.match(
        pattern, template["Outputs"]["BotWebhookUrl"]["Value"]["Fn::Sub"].replace("${BotDomain}", "bot.example.com")
    )


def test_the_load_balancer_forwards_only_the_routes_the_outside_posts_to(template: dict[str, Any]) -> None:
    listener = resource(template, "HttpsListener", "ALIYUN::ALB::Listener")
    assert (listener["ListenerProtocol"], listener["ListenerPort"]) == ("HTTPS", 443)
    routes = resource(template, "BotRoutes", "ALIYUN::ALB::Rule")
    (condition,) = routes["RuleConditions"]
    assert set(condition["PathConfig"]["Values"]) == {CLOUDMONITOR_PATH, EVENTBRIDGE_PATH, REPORTS_PATH}
    rest = resource(template, "NothingElse", "ALIYUN::ALB::Rule")
    assert rest["Priority"] > routes["Priority"] and rest["RuleActions"][0]["Type"] == "FixedResponse"
    health = resource(template, "ServerGroup", "ALIYUN::ALB::ServerGroup")["HealthCheckConfig"]
    assert health["HealthCheckPath"] == "/healthz"
    group = resource(template, "BotGroup", "ALIYUN::ESS::ScalingGroup")
    assert group["AlbServerGroups"] == [{"AlbServerGroupId": {"Ref": "ServerGroup"}, "Port": 8080, "Weight": 100}]
    assert group["MinSize"] == group["MaxSize"] == group["DesiredCapacity"] == {"Ref": "BotCount"}
    assert len(group["VSwitchIds"]) == 2


def test_redis_is_a_standard_tls_instance_that_never_evicts(template: dict[str, Any]) -> None:
    redis = resource(template, "Redis", "ALIYUN::REDIS::Instance")
    assert redis["SSLEnabled"] == "Enable" and redis["EvictionPolicy"] == "noeviction"
    assert redis["VpcPasswordFree"] is False and redis["Password"] == {"Ref": "RedisPassword"}
    assert "cluster" not in template["Parameters"]["RedisInstanceClass"]["Default"]
    assert redis["SecondaryZoneId"] == {"Ref": "ZoneId2"}
    assert template["Parameters"]["RedisPassword"]["NoEcho"] is True


VALUES = {
    "RedisCaCertificate": "-----BEGIN CERTIFICATE-----",
    "RedisPassword": "Pass1234word",
    "Redis.ConnectionDomain": "r-bp1.redis.rds.aliyuncs.com",
    "Redis.Port": "6379",
    "ReportSecret": "s" * 32,
    "WebhookToken": "t" * 16,
    "DingTalkClientId": "ding123",
    "DingTalkClientSecret": "dingSecret0123",
    "CostsToken": "c" * 32,
    "PagerDutyRoutingKey": "R0123456789abcdef0123456789abcdef",
    "PagerDutyWebhookSecret": "w" * 32,
    "OpsgenieApiKey": "g" * 32,
    "OpsgenieWebhookToken": "o" * 32,
    "BotRole.RoleName": "finetune-bot",
    "ALIYUN::Region": "cn-hangzhou",
    "ALIYUN::AccountId": "1234567890",
    "BucketName": "my-finetune",
    "ZoneId1": "cn-hangzhou-j",
    "ZoneId2": "cn-hangzhou-k",
    "RunnerVSwitch1": "vsw-bp1",
    "RunnerVSwitch2": "vsw-bp2",
    "RunnerSecurityGroupId": "sg-bp1",
    "RunnerRoleName": "finetune-runner",
    "RunnerStorageRoleArn": "acs:ram::1234567890:role/finetune-runner-storage",
    "RunnerImageId": "m-bp1",
    "BotDomain": "bot.example.com",
    "ExtraConfig": "policy:\n  max_concurrent_nodes: 2\n# a team's secret, say: hunter2-team",
}


def filled(text: str) -> str:
    return _SUB.sub(lambda m: VALUES[m.group(1)], text)


def kms_secrets(template: dict[str, Any]) -> dict[str, str]:
    """What the stack's KMS secrets hold, with the example values."""
    return {
        body["Properties"]["SecretName"]: filled(body["Properties"]["SecretData"]["Fn::Sub"])
        for body in template["Resources"].values()
        if body["Type"] == "ALIYUN::KMS::Secret"
    }


async def boot_files(template: dict[str, Any]) -> dict[str, str]:
    """The files the boot script writes, with example values for the stack's ${…}: its heredocs as they are, and
    what its ``$kms`` lines read, run for real against a KMS that holds the stack's secrets."""
    script = filled(resource(template, "BotConfiguration", "ALIYUN::ESS::ScalingConfiguration")["UserData"]["Fn::Sub"])
    heredocs = re.findall(r"cat > (\S+) <<'(\w+)'\n(.*?)\n\2\n", script, re.DOTALL)
    files = {path: body + "\n" for path, _, body in heredocs}
    assert script.rstrip().endswith("systemctl enable --now finetune-bot.service")
    command = re.search(r'^kms="/opt/finetune/bin/python (-m bot\.cloud\.aliyun\.secrets --region \S+)"$', script, re.M)
    assert command is not None
    fake = await FakeAliyun().start()
    fake.secrets.update(kms_secrets(template))
    env = {
        **os.environ,
        "ALIBABA_CLOUD_ACCESS_KEY_ID": ACCESS_KEY_ID,  # on the instance: the RAM role's STS key (tests: a key pair)
        "ALIBABA_CLOUD_ACCESS_KEY_SECRET": ACCESS_KEY_SECRET,
        "PYTHONPATH": str(Path(__file__).resolve().parent.parent),
    }
    try:
        for line in re.findall(r"^\$kms (.+)$", script, re.M):
            words, (redirect, path) = line.split()[:-2], line.split()[-2:]
            process = await asyncio.create_subprocess_exec(
                sys.executable, *command.group(1).split(), "--endpoint", fake.endpoint, *words,
                env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            )  # fmt: skip
            out, err = await process.communicate()
            assert process.returncode == 0, err
            files[path] = files.get(path, "") + out.decode() if redirect == ">>" else out.decode()
    finally:
        await fake.stop()
    assert fake.rejected == [] and {name for name, _ in fake.calls} == {"GetSecretValue"}
    for new in [path for path in files if path.endswith(".new")]:
        assert f"mv {new} {new.removesuffix('.new')}" in script
        files[new.removesuffix(".new")] = files.pop(new)
    return files


@pytest.mark.scenario
async def test_the_boot_script_writes_settings_and_a_config_the_bot_accepts(template: dict[str, Any]) -> None:
    files = await boot_files(template)
    assert set(files) == {"/etc/finetune/redis-ca.pem", "/etc/finetune/bot.env", "/etc/finetune/config.yaml"}
    env = dict(line.split("=", 1) for line in files["/etc/finetune/bot.env"].splitlines())
    known = {name.upper() for name in Settings.model_fields} | {
        "ALIBABA_CLOUD_ECS_METADATA",
        "ALIBABA_CLOUD_IMDSV1_DISABLED",
    }
    assert set(env) <= known, set(env) - known
    assert env["FINETUNE_CLOUD"] == "aliyun" and env["FINETUNE_CONFIG"] == "/etc/finetune/config.yaml"
    assert env["ALIBABA_CLOUD_IMDSV1_DISABLED"] == "true"  # the bot's SDK reads its role with a session token
    check_redis_url(env["REDIS_URL"])
    assert env["REDIS_URL"].startswith("rediss://") and "ssl_ca_certs=/etc/finetune/redis-ca.pem" in env["REDIS_URL"]
    config = parse_file_config(files["/etc/finetune/config.yaml"], "the boot script's config")
    assert config.aliyun is not None and config.policy.max_concurrent_nodes == 2
    assert config.aliyun.report_url == f"https://bot.example.com{REPORTS_PATH}"
    assert config.aliyun.vswitches == {"cn-hangzhou-j": "vsw-bp1", "cn-hangzhou-k": "vsw-bp2"}
    assert len(env["FINETUNE_REPORT_SECRET"]) >= 32  # the stack's MinLength; aliyun.report_url needs it set
    assert (env["FINETUNE_ALIYUN_WEBHOOK_TOKEN"], env["DINGTALK_CLIENT_SECRET"]) == ("t" * 16, "dingSecret0123")


def test_no_secret_is_in_the_user_data_they_come_from_kms_with_the_bots_role(template: dict[str, Any]) -> None:
    configuration = template["Resources"]["BotConfiguration"]
    user_data = configuration["Properties"]["UserData"]["Fn::Sub"]
    secret_parameters = {name for name, body in template["Parameters"].items() if body.get("NoEcho")}
    assert secret_parameters >= {"WebhookToken", "ReportSecret", "RedisPassword", "DingTalkClientSecret"}
    used = {match.group(1) for match in _SUB.finditer(user_data)}
    assert not used & (secret_parameters | {"ExtraConfig"}), used & secret_parameters
    script = filled(user_data)
    for name in secret_parameters | {"ExtraConfig"}:
        assert VALUES[name] not in script, name
    assert "hunter2-team" not in script  # what a team writes in ExtraConfig stays out too
    # Every secret the script reads is one of the stack's KMS secrets, which the instance's role may read (only).
    secrets = kms_secrets(template)
    read = set(re.findall(r"^\$kms (?:env-file|value) (\S+) ", script, re.M))
    assert read == set(secrets) and all(name.startswith("finetune-bot/") for name in read)
    assert set(configuration["DependsOn"]) == {"BotEnvSecret", "BotConfigSecret"}  # they exist before any boot
    (policy,) = resource(template, "BotRole", "ALIYUN::RAM::Role")["Policies"]
    statement, _ = policy["PolicyDocument"]["Statement"]  # the other: its metadata mode (the test below)
    assert statement["Action"] == "kms:GetSecretValue"
    (arn,) = statement["Resource"]
    assert arn == {"Fn::Sub": "acs:kms:${ALIYUN::Region}:${ALIYUN::AccountId}:secret/finetune-bot/*"}
    # The other secrets the template holds stay where they were: Redis's own password, KMS's secret data.
    assert all(VALUES[name] in "".join(secrets.values()) for name in ("WebhookToken", "ReportSecret", "RedisPassword"))


async def test_the_bot_instance_switches_to_the_hardened_metadata_mode_before_it_reads_a_secret(
    template: dict[str, Any],
) -> None:
    """ROS cannot launch the bot's instances hardened, so the boot script's first act is to ask ECS for it with the
    instance's role; run here for real against the ECS double, the instance id read with a session token."""
    configuration = resource(template, "BotConfiguration", "ALIYUN::ESS::ScalingConfiguration")
    script = filled(configuration["UserData"]["Fn::Sub"])
    lines = script.splitlines()
    harden = next(i for i, line in enumerate(lines) if "bot.cloud.aliyun.metadata" in line)
    assert lines[harden - 1] == "export ALIBABA_CLOUD_ECS_METADATA=finetune-bot ALIBABA_CLOUD_IMDSV1_DISABLED=true"
    assert harden < min(i for i, line in enumerate(lines) if line.startswith("$kms "))  # before any secret
    assert lines[0] == "#!/bin/bash" and lines[1] == "set -euo pipefail"  # a refusal stops the boot: no bot
    program, *arguments = lines[harden].split()
    assert program == "/opt/finetune/bin/python" and arguments[-1] == "harden"

    fake = await FakeAliyun().start()
    bot = fake.add_instance({"finetune:role": "bot"})
    metadata = await LocalMetadataServer(dialect="aliyun", instance_id=bot.instance_id).start()
    env = {
        **os.environ,
        "ALIBABA_CLOUD_ACCESS_KEY_ID": ACCESS_KEY_ID,  # on the instance: the RAM role's STS key (tests: a key pair)
        "ALIBABA_CLOUD_ACCESS_KEY_SECRET": ACCESS_KEY_SECRET,
        "ALIBABA_CLOUD_METADATA_ENDPOINT": metadata.endpoint,
        "PYTHONPATH": str(Path(__file__).resolve().parent.parent),
    }
    try:
        process = await asyncio.create_subprocess_exec(
            sys.executable, *arguments[:-1], "--endpoint", fake.endpoint, arguments[-1],
            env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        _, err = await process.communicate()
    finally:
        await metadata.stop()
        await fake.stop()
    assert process.returncode == 0, err
    assert bot.metadata_options == {"HttpEndpoint": "enabled", "HttpTokens": "required"}  # no hop limit: none usable
    assert [params["InstanceId"] for params in fake.actions("ModifyInstanceMetadataOptions")] == [bot.instance_id]
    assert metadata.refused_without_token == 0 and metadata.token_requests == 1  # read the hardened way already

    # Its role may do that to the bot's own instances only: those its scaling configuration tags.
    assert {"Key": "finetune:role", "Value": "bot"} in configuration["TagList"]
    (policy,) = resource(template, "BotRole", "ALIYUN::RAM::Role")["Policies"]
    _, statement = policy["PolicyDocument"]["Statement"]
    assert statement["Action"] == "ecs:ModifyInstanceMetadataOptions"
    assert statement["Condition"] == {"StringEquals": {"acs:ResourceTag/finetune:role": "bot"}}
    assert statement["Resource"] == [{"Fn::Sub": "acs:ecs:${ALIYUN::Region}:${ALIYUN::AccountId}:instance/*"}]


async def test_a_bot_instance_ecs_will_not_harden_does_not_boot() -> None:
    fake = await FakeAliyun().start()
    metadata = await LocalMetadataServer(dialect="aliyun", instance_id="i-bp-not-launched").start()
    env = {
        **os.environ,
        "ALIBABA_CLOUD_ACCESS_KEY_ID": ACCESS_KEY_ID,
        "ALIBABA_CLOUD_ACCESS_KEY_SECRET": ACCESS_KEY_SECRET,
        "ALIBABA_CLOUD_METADATA_ENDPOINT": metadata.endpoint,
        "PYTHONPATH": str(Path(__file__).resolve().parent.parent),
    }
    try:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bot.cloud.aliyun.metadata", "--region", "cn-hangzhou", "--endpoint", fake.endpoint,
            "harden", env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        _, err = await process.communicate()
    finally:
        await metadata.stop()
        await fake.stop()
    assert process.returncode == 1
    assert err.decode().splitlines() == [
        "finetune: ECS refused to harden i-bp-not-launched's metadata: InvalidInstanceId.NotFound"
    ]

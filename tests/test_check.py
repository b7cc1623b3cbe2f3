"""``finetune-bot check`` as a newcomer runs it, and ``serve``'s checks at start: the local defaults pass; on AWS (moto
in server mode) each missing part is one ``✗`` line naming it, and nothing else fails; a cloud without an event
source or a region does not start."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from bot.chat.slack.config import SlackConfig
from bot.chat.slack.probe import check_slack
from bot.checks.report import exit_status, line, start_refusal
from bot.checks.result import Check, failed, passed
from bot.cloud.aliyun.provider import AliyunCloud
from bot.cloud.aliyun.settings import AliyunSettings
from bot.cloud.base import SetupScope
from bot.owner_lock import OwnerLock
from fakes.fake_dingtalk import FakeDingTalk
from fakes.fake_slack import BOT_TOKEN, SIGNING_SECRET, FakeSlack
from handlers.report_keys import ReportKeys
from tests.aliyun_fakes import ACCESS_KEY_ID, ACCESS_KEY_SECRET, FakeAliyun

ROLE_ID = "AROAEXAMPLEEXAMPLE123"
ALIYUN_REGION = "cn-hangzhou"
BUCKET = "finetune-checkpoints"
QUEUE_IN_WEST = "https://sqs.us-west-2.amazonaws.com/123456789012/finetune-events"  # as the region's stack says
FIS_TRUST = {
    "Version": "2012-10-17",
    "Statement": [{"Effect": "Allow", "Principal": {"Service": "fis.amazonaws.com"}, "Action": "sts:AssumeRole"}],
}


def bot_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key != "REDIS_URL" and not key.startswith("SLACK_")}
    env.update({"FINETUNE_STATE_DIR": str(tmp_path / "state"), "FINETUNE_HTTP_PORT": "0", **extra})
    return env


async def finetune_bot(command: str, env: dict[str, str]) -> tuple[int, list[str], list[str]]:
    """Run ``finetune-bot <command>`` to its end (the fakes keep serving meanwhile); exit status, stdout's and
    stderr's lines."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot.cli", command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), 180)
    finally:
        if proc.returncode is None:  # it ran on (a serve that started): not what any test here expects
            proc.kill()
            await proc.wait()
    assert proc.returncode is not None
    return proc.returncode, out.decode().splitlines(), err.decode().splitlines()


def aws_config(tmp_path: Path, **extra: object) -> str:
    section = {"bucket": BUCKET, "image_id": "ami-0abcdef1234567890", "runner_role_id": ROLE_ID, **extra}
    path = tmp_path / "bot.yaml"
    path.write_text(json.dumps({"aws": section}))  # JSON is YAML
    return str(path)


@pytest.fixture
async def slack() -> AsyncIterator[FakeSlack]:
    async with FakeSlack() as fake:
        yield fake


# -- the lines -----------------------------------------------------------------------------------------------


def test_a_line_per_check_with_the_fix_of_a_failure_and_the_exit_status() -> None:
    good = passed("Redis", "Valkey 8.1.1, single node")
    bad = failed("S3 bucket b", "does not exist", "create it\nor set aws.bucket")
    assert line(good) == "✓ Redis: Valkey 8.1.1, single node"
    assert line(bad) == "✗ S3 bucket b: does not exist — fix: create it or set aws.bucket"  # one line, always
    assert exit_status([good]) == 0 and exit_status([good, bad]) == 1


def test_serve_refuses_only_what_blocks_the_start_in_one_line() -> None:
    region = failed("AWS region", "none set", "set aws.region", blocks_start=True)
    source = failed("event source", "none", "set FINETUNE_SQS_QUEUE_URL", blocks_start=True)
    bucket = failed("S3 bucket b", "does not exist", "create it")
    assert start_refusal([passed("a", "b"), bucket], "aws") is None
    assert start_refusal([bucket, region], "aws") == "cannot serve on aws: AWS region: none set — fix: set aws.region"
    both = start_refusal([region, bucket, source], "aws")
    assert both is not None and "\n" not in both
    assert both.startswith("cannot serve on aws: AWS region: none set; event source: none — ")


# -- the local defaults ----------------------------------------------------------------------------------------


@pytest.mark.scenario  # a bot process
async def test_the_local_defaults_pass_every_check(tmp_path: Path) -> None:
    status, lines, errors = await finetune_bot("check", bot_env(tmp_path))
    assert status == 0, lines + errors
    assert lines and all(text.startswith("✓ ") for text in lines), lines
    names = [text[2:].split(":", 1)[0] for text in lines]
    assert names == ["configuration", "Redis", "local cloud", "event source", "chat"]
    assert "embedded" in lines[1] and "single node" in lines[1]  # the Valkey serve would start, asked for real
    with OwnerLock(tmp_path / "state" / "bot.lock"), OwnerLock(tmp_path / "state" / "redis" / "owner.lock"):
        pass  # the state dir and the embedded server's data were let go: a bot may start there now


@pytest.mark.scenario  # bot processes
async def test_a_configuration_that_does_not_parse_is_one_line_and_exit_2_as_for_serve(tmp_path: Path) -> None:
    for command in ("check", "serve"):
        status, lines, errors = await finetune_bot(command, bot_env(tmp_path, FINETUNE_CLOUD="aws"))
        assert (status, lines) == (2, [])
        said = "FINETUNE_CLOUD=aws needs an aws: section in FINETUNE_CONFIG (bucket, image_id, …)"
        assert errors == [f"finetune-bot: {said}"]


# -- AWS -------------------------------------------------------------------------------------------------------


async def test_on_aws_each_missing_part_is_one_failed_line_and_nothing_else_fails(
    tmp_path: Path, aws: str, slack: FakeSlack
) -> None:
    iam = boto3.client("iam", endpoint_url=aws)
    role = iam.create_role(RoleName="finetune-fis", AssumeRolePolicyDocument=json.dumps(FIS_TRUST))["Role"]["Arn"]
    sqs = boto3.client("sqs", endpoint_url=aws)
    missing_queue = sqs.get_queue_url(QueueName=sqs.create_queue(QueueName="gone")["QueueUrl"].rsplit("/", 1)[-1])
    sqs.delete_queue(QueueUrl=missing_queue["QueueUrl"])  # a URL of the right shape, to a queue that is not there
    env = bot_env(
        tmp_path,
        FINETUNE_CLOUD="aws",
        FINETUNE_CONFIG=aws_config(tmp_path, fis_role_arn=role),
        FINETUNE_SQS_QUEUE_URL=missing_queue["QueueUrl"],
        SLACK_BOT_TOKEN="xoxb-not-the-apps-token",
        SLACK_SIGNING_SECRET=SIGNING_SECRET,
        SLACK_API_URL=slack.api_url,
    )
    status, lines, errors = await finetune_bot("check", env)

    assert status == 1, lines + errors
    failures = [text for text in lines if not text.startswith("✓ ")]
    assert len(failures) == 3, lines
    bucket, queue, token = failures
    assert queue.startswith("✗ SQS queue gone (us-east-1): ") and "does not exist" in queue
    assert "FINETUNE_SQS_QUEUE_URL" in queue
    assert bucket.startswith(f"✗ S3 bucket {BUCKET}: does not exist — fix: ") and "aws.bucket" in bucket
    assert token.startswith("✗ Slack bot token: refused by Slack: invalid_auth — fix: ") and "SLACK_BOT_TOKEN" in token
    passing = {text[2:].split(":", 1)[0] for text in lines if text.startswith("✓ ")}
    assert passing == {
        "configuration",
        "Redis",
        "AWS region",
        "AWS credentials",
        "EC2 launch (dry run)",
        "FIS role finetune-fis",
        "event source",
        "chat",
    }
    assert "✓ AWS region: us-east-1 (from AWS_REGION)" in lines
    assert "xoxb-not-the-apps-token" not in "\n".join(lines + errors)  # a token is never said
    assert [call.token for call in slack.called("auth.test", ok=False)] == ["xoxb-not-the-apps-token"]


async def test_on_aws_a_complete_setup_passes_and_a_missing_subscription_or_scope_fails(
    tmp_path: Path, aws: str, slack: FakeSlack
) -> None:
    s3 = boto3.client("s3", endpoint_url=aws)
    s3.create_bucket(Bucket=BUCKET)
    sqs, sns = boto3.client("sqs", endpoint_url=aws), boto3.client("sns", endpoint_url=aws)
    dead = sqs.create_queue(QueueName="finetune-events-dlq")["QueueUrl"]
    dead_arn = sqs.get_queue_attributes(QueueUrl=dead, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    redrive = json.dumps({"deadLetterTargetArn": dead_arn, "maxReceiveCount": 5})
    queue = sqs.create_queue(QueueName="finetune-events", Attributes={"RedrivePolicy": redrive})["QueueUrl"]
    queue_arn = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    events, reports = (sns.create_topic(Name=name)["TopicArn"] for name in ("finetune-events", "finetune-reports"))
    sns.subscribe(TopicArn=events, Protocol="sqs", Endpoint=queue_arn)
    env = bot_env(
        tmp_path,
        FINETUNE_CLOUD="aws",
        FINETUNE_CONFIG=aws_config(tmp_path, report_topic_arn=reports),
        FINETUNE_SQS_QUEUE_URL=queue,
        FINETUNE_EVENTS_TOPICS=events,
        SLACK_BOT_TOKEN=BOT_TOKEN,
        SLACK_SIGNING_SECRET=SIGNING_SECRET,
        SLACK_API_URL=slack.api_url,
    )
    slack.scopes.remove("commands")
    status, lines, errors = await finetune_bot("check", env)
    assert status == 1, lines + errors
    failures = [text for text in lines if not text.startswith("✓ ")]
    assert failures == [
        "✗ SNS finetune-reports → finetune-events: the queue is not subscribed to the topic — fix: aws sns subscribe "
        f"--topic-arn {reports} --protocol sqs --notification-endpoint {queue_arn}, and let the topic send to the "
        "queue in its policy",
        "✗ Slack scopes: missing commands: the slash command — fix: add commands to the app's bot token scopes (OAuth "
        "& Permissions) and reinstall it",
    ]
    assert "✓ SNS finetune-events → finetune-events: subscribed" in lines
    assert "✓ SQS queue finetune-events (us-east-1): 0 messages waiting, dead letters to finetune-events-dlq" in lines

    sns.subscribe(TopicArn=reports, Protocol="sqs", Endpoint=queue_arn)
    slack.scopes.append("commands")
    status, lines, errors = await finetune_bot("check", env)
    assert status == 0, lines + errors
    assert all(text.startswith("✓ ") for text in lines), lines
    assert any(text.startswith(f"✓ S3 bucket {BUCKET}: exists") for text in lines)
    assert any(text.startswith("✓ Slack scopes: chat:write, commands, channels:history") for text in lines)


def regional_queue(region: str, endpoint: str) -> tuple[Any, str, str]:
    """A runner stack's queue in ``region`` (with its dead-letter queue) fed by the region's events topic, as
    deploy/aws/finetune.yaml makes them: the SQS client, the queue's ARN and the topic's."""
    sqs = boto3.client("sqs", endpoint_url=endpoint, region_name=region)
    sns = boto3.client("sns", endpoint_url=endpoint, region_name=region)
    dead = sqs.create_queue(QueueName="finetune-events-dlq")["QueueUrl"]
    dead_arn = sqs.get_queue_attributes(QueueUrl=dead, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    redrive = json.dumps({"deadLetterTargetArn": dead_arn, "maxReceiveCount": 5})
    queue = sqs.create_queue(QueueName="finetune-events", Attributes={"RedrivePolicy": redrive})["QueueUrl"]
    queue_arn = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    topic = sns.create_topic(Name="finetune-events")["TopicArn"]
    return sns, queue_arn, topic


async def test_on_aws_check_asks_each_regions_queue_and_topic_in_that_region(tmp_path: Path, aws: str) -> None:
    """Two runner stacks: the home region's queue by moto's URL (no region in it: the home region), the other's by
    the URL AWS gives (its region read from it); each is asked in its region, with its own region's topic."""
    boto3.client("s3", endpoint_url=aws).create_bucket(Bucket=BUCKET)
    home_sns, home_arn, home_topic = regional_queue("us-east-1", aws)
    west_sns, west_arn, west_topic = regional_queue("us-west-2", aws)
    home_sns.subscribe(TopicArn=home_topic, Protocol="sqs", Endpoint=home_arn)
    home_queue = boto3.client("sqs", endpoint_url=aws).get_queue_url(QueueName="finetune-events")["QueueUrl"]
    assert "us-east-1" not in home_queue and home_arn != west_arn  # one name, two regions
    env = bot_env(
        tmp_path,
        FINETUNE_CLOUD="aws",
        FINETUNE_CONFIG=aws_config(tmp_path),
        FINETUNE_SQS_QUEUE_URL=f"{home_queue},{QUEUE_IN_WEST}",
        FINETUNE_EVENTS_TOPICS=f"{home_topic},{west_topic}",
    )
    status, lines, errors = await finetune_bot("check", env)
    assert status == 1, lines + errors  # no chat, and the west queue's subscription
    intake = [text for text in lines if text[2:].startswith(("SQS", "SNS"))]
    fix = f"aws sns subscribe --topic-arn {west_topic} --protocol sqs --notification-endpoint {west_arn}"
    assert f"✓ event source: SQS queues {home_queue}, {QUEUE_IN_WEST}" in lines
    assert intake == [
        "✓ SQS queue finetune-events (us-east-1): 0 messages waiting, dead letters to finetune-events-dlq",
        "✓ SNS finetune-events → finetune-events: subscribed",
        "✓ SQS queue finetune-events (us-west-2): 0 messages waiting, dead letters to finetune-events-dlq",
        f"✗ SNS finetune-events → finetune-events: the queue is not subscribed to the topic — fix: {fix}, and let the "
        "topic send to the queue in its policy",
    ], lines

    west_sns.subscribe(TopicArn=west_topic, Protocol="sqs", Endpoint=west_arn)
    status, lines, errors = await finetune_bot("check", env)
    intake = [text for text in lines if text[2:].startswith(("SQS", "SNS"))]
    assert len(intake) == 4 and all(text.startswith("✓ ") for text in intake), lines


@pytest.mark.parametrize(
    "queues",
    [
        "https://sqs.amazonaws.com/123456789012/finetune-events",  # an AWS host without its region
        "https://sqs.us-west-2.amazonaws.com/finetune-events",  # no account
        f"{QUEUE_IN_WEST},{QUEUE_IN_WEST}",
        "sqs://finetune-events",
    ],
)
async def test_serve_with_a_bad_queue_url_is_one_line_and_exit_2(tmp_path: Path, aws: str, queues: str) -> None:
    env = bot_env(tmp_path, FINETUNE_CLOUD="aws", FINETUNE_CONFIG=aws_config(tmp_path), FINETUNE_SQS_QUEUE_URL=queues)
    status, lines, errors = await finetune_bot("serve", env)
    assert status == 2
    assert lines == [] and len(errors) == 1, errors
    assert "FINETUNE_SQS_QUEUE_URL=" in errors[0] and "Traceback" not in errors[0]
    assert not (tmp_path / "state" / "redis").exists()  # refused before anything started


@pytest.mark.parametrize(
    ("unset", "extra", "named"),
    [
        ((), {}, "event source: none: FINETUNE_SQS_QUEUE_URL and FINETUNE_SNS_TOPICS are unset"),
        (("AWS_REGION", "AWS_DEFAULT_REGION"), {"FINETUNE_SQS_QUEUE_URL": QUEUE_IN_WEST}, "AWS region: none set"),
    ],
)
async def test_serve_on_aws_without_an_event_source_or_a_region_is_one_line_and_exit_2(
    tmp_path: Path, aws: str, unset: tuple[str, ...], extra: dict[str, str], named: str
) -> None:
    env = bot_env(tmp_path, FINETUNE_CLOUD="aws", FINETUNE_CONFIG=aws_config(tmp_path), **extra)
    for name in unset:
        env.pop(name)
    env["AWS_CONFIG_FILE"] = str(tmp_path / "no-aws-config")  # no profile region either
    status, lines, errors = await finetune_bot("serve", env)
    assert status == 2
    assert lines == [] and len(errors) == 1, errors
    assert errors[0].startswith(f"finetune-bot: cannot serve on aws: {named}") and " — fix: " in errors[0]
    assert not (tmp_path / "state" / "redis").exists()  # refused before anything started


async def test_serve_says_its_checks_and_starts_despite_a_failure_that_does_not_block(tmp_path: Path, aws: str) -> None:
    """A missing bucket is said at start (a warning), and the bot runs: it has spot warnings to handle meanwhile."""
    sqs = boto3.client("sqs", endpoint_url=aws)
    queue = sqs.create_queue(QueueName="finetune-events")["QueueUrl"]
    env = bot_env(tmp_path, FINETUNE_CLOUD="aws", FINETUNE_CONFIG=aws_config(tmp_path), FINETUNE_SQS_QUEUE_URL=queue)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot.cli", "serve", env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        assert proc.stdout is not None
        serving = await asyncio.wait_for(proc.stdout.readline(), 120)
        assert serving.startswith(b"finetune-bot serving on port"), serving
    finally:
        proc.terminate()
        _, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0
    logged = [text.split(" bot: check ", 1)[-1] for text in err.decode().splitlines() if " bot: check " in text]
    assert f"✗ S3 bucket {BUCKET}: does not exist" in "\n".join(logged)
    assert [text.split(":", 1)[0] for text in logged] == [
        "✓ AWS region",
        "✓ AWS credentials",
        "✓ EC2 launch (dry run)",
        f"✗ S3 bucket {BUCKET}",
        "✗ SQS queue finetune-events (us-east-1)",  # no redrive policy: said, not fatal
        "✓ event source",
        "✗ chat",
    ]


# -- the chat platforms, asked directly ----------------------------------------------------------------------


async def test_slack_in_socket_mode_checks_the_app_token_too(slack: FakeSlack) -> None:
    found = await check_slack(BOT_TOKEN, None, "xapp-1-another-token", SlackConfig(), slack.api_url)
    assert [(check.name, check.ok) for check in found] == [
        ("Slack bot token", True),
        ("Slack scopes", True),
        ("Slack app token", False),
    ]
    found = await check_slack(BOT_TOKEN, None, slack.app_token, SlackConfig(team_id="T0OTHER"), slack.api_url)
    assert [(check.name, check.ok) for check in found] == [("Slack bot token", False), ("Slack app token", True)]
    assert "belongs to T0TEST, but slack.team_id is T0OTHER" in found[0].detail


async def test_a_slack_token_without_its_partner_is_a_failed_line_not_a_crash(slack: FakeSlack) -> None:
    [found] = await check_slack(BOT_TOKEN, None, None, SlackConfig(), slack.api_url)
    assert not found.ok and "neither SLACK_SIGNING_SECRET" in found.detail
    assert slack.calls == []  # nothing asked of Slack


@pytest.mark.scenario  # the fake DingTalk
async def test_dingtalk_gets_its_token_or_says_it_was_refused() -> None:
    from bot.chat.dingtalk.probe import check_dingtalk

    async with FakeDingTalk() as dingtalk:
        [good] = await check_dingtalk(dingtalk.client_id, dingtalk.client_secret, dingtalk.url)
        [bad] = await check_dingtalk(dingtalk.client_id, "not-the-secret", dingtalk.url)
    assert good == Check("DingTalk app", True, f"{dingtalk.client_id} gets an access token")
    assert not bad.ok and "DingTalk refused its credentials" in bad.detail and "DINGTALK_CLIENT_SECRET" in bad.fix
    assert "not-the-secret" not in bad.detail


# -- Alibaba Cloud (the local fake of the ECS / ESS OpenAPI, moto standing in for OSS) ---------------------------


@pytest.fixture
async def aliyun(aws: str, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[FakeAliyun]:
    monkeypatch.setenv("ALIBABA_CLOUD_ECS_METADATA_DISABLED", "true")  # never ask a real metadata service
    fake = await FakeAliyun(ALIYUN_REGION).start()
    fake.vswitch_zones = {"vsw-j": "cn-hangzhou-j"}
    boto3.client("s3", endpoint_url=aws).create_bucket(Bucket="ft-oss")
    yield fake
    await fake.stop()


async def aliyun_checks(fake: FakeAliyun, oss: str, **changes: object) -> list[Check]:
    section: dict[str, object] = {
        "region": ALIYUN_REGION,
        "bucket": "ft-oss",
        "endpoint": fake.endpoint,
        "ess_endpoint": fake.endpoint,
        "access_key_id": ACCESS_KEY_ID,
        "access_key_secret": ACCESS_KEY_SECRET,
        "allow_static_keys": True,  # the fake's key pair
        "oss_endpoint": oss,
        "oss_addressing": "path",
        "vswitches": {"cn-hangzhou-j": "vsw-j"},
        "image_id": "m-finetune-runner",
        "ram_role": "finetune-runner",
        **changes,
    }
    cloud = AliyunCloud(AliyunSettings.model_validate(section), report_keys=ReportKeys("master"))
    try:
        return await cloud.check_setup(SetupScope(instance_types=("ecs.gn7i-c8g1.2xlarge",)))
    finally:
        await cloud.close()


async def test_on_alibaba_the_launch_is_dry_run_and_the_bucket_found(aliyun: FakeAliyun, aws: str) -> None:
    found = await aliyun_checks(aliyun, aws)
    assert [(check.name, check.ok) for check in found] == [
        ("Alibaba Cloud region", True),
        ("Alibaba Cloud credentials", True),
        ("ECS launch (dry run)", True),
        ("OSS bucket ft-oss", True),
    ], found
    [launch] = aliyun.actions("RunInstances")
    assert launch["DryRun"].lower() == "true" and launch["SpotStrategy"] == "SpotAsPriceGo" and launch["RamRoleName"]
    assert aliyun.live() == []  # nothing started

    aliyun.run_fault = lambda params: "Forbidden.RAM"
    denied = {check.name: check for check in await aliyun_checks(aliyun, aws, bucket="ft-gone")}
    assert not denied["ECS launch (dry run)"].ok and "ecs:RunInstances" in denied["ECS launch (dry run)"].fix
    assert denied["OSS bucket ft-gone"].detail == "does not exist"
    assert all(check.ok for name, check in denied.items() if name not in ("ECS launch (dry run)", "OSS bucket ft-gone"))


async def test_on_alibaba_refused_credentials_block_the_start_and_nothing_more_is_asked(
    aliyun: FakeAliyun, aws: str
) -> None:
    found = await aliyun_checks(aliyun, aws, access_key_id="LTAI-someone-else")
    assert [(check.name, check.ok, check.blocks_start) for check in found] == [
        ("Alibaba Cloud region", True, False),
        ("Alibaba Cloud credentials", False, True),
    ]
    assert "InvalidAccessKeyId.NotFound" in found[1].detail
    assert aliyun.actions("RunInstances") == []

    found = await aliyun_checks(aliyun, aws, region="cn-nowhere")
    assert [(check.name, check.ok) for check in found] == [
        ("Alibaba Cloud region", True),
        ("Alibaba Cloud credentials", False),
    ]
    assert found[1].detail == "accepted, but ECS offers no region cn-nowhere" and not found[1].blocks_start

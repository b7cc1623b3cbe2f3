"""Least privilege in every template: no mutating grant on everything, and the scoping conditions really scope.

The walk reads every IAM and RAM statement of every CloudFormation and ROS template under deploy/ and fails on an
Allow of a mutating action on ``*`` without a condition; read-only actions (Describe*, List*, Get*) and the few
listed in ``UNSCOPABLE`` (each with the reason) are the exceptions. The grant tests then ask the policies, evaluated
as the clouds do (tests/policy_eval.py; moto evaluates no resource or condition), what a bot or a runner may do.
"""

from __future__ import annotations

import pytest

from handlers.storage_sessions import aliyun_session_policy, session_policy
from tests.policy_eval import (
    Statement,
    _glob,
    allowed,
    att,
    listed,
    policy_of,
    ref,
    resolve,
    statements,
    templates,
)

READ_ONLY_VERBS = ("Describe", "List", "Get")
# Mutating actions allowed on "*" without a condition, and why nothing narrower exists.
UNSCOPABLE: dict[str, str] = {
    "ssmmessages:CreateControlChannel": "Session Manager's agent channel: SSM defines no resource or condition for it",
    "ssmmessages:CreateDataChannel": "Session Manager's agent channel: SSM defines no resource or condition for it",
    "ssmmessages:OpenControlChannel": "Session Manager's agent channel: SSM defines no resource or condition for it",
    "ssmmessages:OpenDataChannel": "Session Manager's agent channel: SSM defines no resource or condition for it",
}
# AWS managed policies a role may carry (their statements are not in the template, so each is named here).
MANAGED_POLICIES: dict[tuple[str, str], set[str]] = {
    # EC2 Image Builder drives its build instance through SSM and requires these two on it; the instance is
    # short-lived, builds the image and never runs a job or reaches the checkpoint bucket.
    ("aws/runner-image.yaml", "BuildRole"): {
        "arn:aws:iam::aws:policy/AmazonSSMManagedInstanceCore",
        "arn:aws:iam::aws:policy/EC2InstanceProfileForImageBuilder",
    },
    # The bot's task role: the runner stack's BotPolicy (walked above, in aws/finetune.yaml).
    ("aws/bot.yaml", "BotRole"): {"import-ref-RunnerStackName-BotPolicyArn"},
}

AWS_INSTANCE = "arn:aws:ec2:us-east-1:123456789012:instance/i-0abc"
OUR_TEMPLATE = f"arn:aws:ec2:us-east-1:123456789012:launch-template/{ref('RunnerLaunchTemplate')}"
BUCKET = att("CheckpointBucket")
OSS = "acs:oss:*:*:ref-BucketName"


def all_statements() -> list[Statement]:
    return [s for name, document in templates().items() for s in statements(name, document)]


def test_the_walk_sees_every_template_with_grants() -> None:
    found = {s.where.split()[0] for s in all_statements()}
    assert found == {
        "aws/finetune.yaml",
        "aws/bot.yaml",
        "aws/runner-image.yaml",
        "aliyun/finetune.ros.yaml",
        "aliyun/bot.ros.yaml",
    }
    assert len(all_statements()) > 40


def unscoped_grants(found: list[Statement]) -> list[str]:
    """Each Allow of a mutating action on "*" without a condition (not read-only, not in UNSCOPABLE)."""
    offending = []
    for statement in found:
        assert "NotAction" not in statement.body and "NotResource" not in statement.body, statement.where
        if statement.effect != "Allow":
            continue
        offending += [f"{statement.where}: {action}" for action in statement.actions if "*" in action]
        if "*" not in statement.resources or statement.body.get("Condition"):
            continue
        for action in statement.actions:
            if not action.split(":", 1)[1].startswith(READ_ONLY_VERBS) and action not in UNSCOPABLE:
                offending.append(f"{statement.where}: {action} on *")
    return offending


def test_no_mutating_action_on_everything_without_a_condition() -> None:
    assert unscoped_grants(all_statements()) == []


def test_the_walk_fails_an_unconditioned_mutating_grant() -> None:
    """The same walk on a policy that breaks the rule, so it is shown able to fail."""
    bad = [
        {"Effect": "Allow", "Action": "ec2:CreateTags", "Resource": "*"},
        {"Effect": "Allow", "Action": "ec2:DescribeInstances", "Resource": "*"},
        {"Effect": "Allow", "Action": "s3:*", "Resource": "arn:aws:s3:::b/*"},
        {"Effect": "Allow", "Action": "ec2:RunInstances", "Resource": "*", "Condition": {"Null": {"k": "false"}}},
    ]
    document = {
        "Resources": {"Bad": {"Type": "AWS::IAM::ManagedPolicy", "Properties": {"PolicyDocument": {"Statement": bad}}}}
    }
    assert unscoped_grants(list(statements("bad.yaml", document))) == [
        "bad.yaml Bad Bad: ec2:CreateTags on *",
        "bad.yaml Bad Bad: s3:*",
    ]


def test_only_the_listed_managed_policies_are_attached() -> None:
    for template, document in templates().items():
        for name, resource in document["Resources"].items():
            if resource["Type"] != "AWS::IAM::Role":
                continue
            arns = {str(resolve(arn)) for arn in resource["Properties"].get("ManagedPolicyArns", [])}
            assert arns == MANAGED_POLICIES.get((template, name), set()), f"{template} {name}"


# -- AWS: the bot ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bot() -> list[Statement]:
    return policy_of("aws/finetune.yaml", "BotPolicy")


def test_the_bot_cannot_tag_an_instance_it_did_not_launch(bot: list[Statement]) -> None:
    managed = {"aws:RequestTag/finetune:managed": "true"}
    assert not allowed(bot, "ec2:CreateTags", AWS_INSTANCE, managed)  # CreateTags on an existing instance
    assert not allowed(bot, "ec2:CreateTags", AWS_INSTANCE, {**managed, "ec2:CreateAction": "CreateTags"})
    assert allowed(bot, "ec2:CreateTags", AWS_INSTANCE, {**managed, "ec2:CreateAction": "RunInstances"})


def test_the_bot_launches_only_tagged_instances_from_the_stacks_template(bot: list[Statement]) -> None:
    launch = {"aws:RequestTag/finetune:managed": "true", "ec2:LaunchTemplate": OUR_TEMPLATE}
    assert allowed(bot, "ec2:RunInstances", AWS_INSTANCE, launch)
    assert not allowed(bot, "ec2:RunInstances", AWS_INSTANCE, {"ec2:LaunchTemplate": OUR_TEMPLATE})
    other = OUR_TEMPLATE.rsplit("/", 1)[0] + "/lt-someone-elses"
    assert not allowed(bot, "ec2:RunInstances", AWS_INSTANCE, {**launch, "ec2:LaunchTemplate": other})
    assert allowed(bot, "ec2:CreateLaunchTemplateVersion", OUR_TEMPLATE)
    assert not allowed(bot, "ec2:CreateLaunchTemplateVersion", other)
    assert not allowed(bot, "ec2:CreateLaunchTemplate", other)
    assert allowed(bot, "ec2:CreateLaunchTemplate", other, {"aws:RequestTag/finetune:managed": "true"})


def test_the_bot_terminates_scales_and_interrupt_tests_only_what_is_ours(bot: list[Statement]) -> None:
    ours = {"ec2:ResourceTag/finetune:managed": "true"}
    assert allowed(bot, "ec2:TerminateInstances", AWS_INSTANCE, ours)
    assert not allowed(bot, "ec2:TerminateInstances", AWS_INSTANCE)
    group = "arn:aws:autoscaling:us-east-1:123456789012:autoScalingGroup:u-1:autoScalingGroupName/finetune-ft-1"
    tagged = {"autoscaling:ResourceTag/finetune:managed": "true"}
    assert allowed(bot, "autoscaling:UpdateAutoScalingGroup", group, tagged)
    assert not allowed(bot, "autoscaling:UpdateAutoScalingGroup", group)
    assert not allowed(bot, "autoscaling:UpdateAutoScalingGroup", group.replace("finetune-ft-1", "web"), tagged)
    assert allowed(bot, "autoscaling:CreateAutoScalingGroup", group, {"aws:RequestTag/finetune:managed": "true"})
    assert not allowed(bot, "autoscaling:CreateAutoScalingGroup", group)
    template = "arn:aws:fis:us-east-1:123456789012:experiment-template/EXT1"
    assert allowed(bot, "fis:StartExperiment", template, {"aws:ResourceTag/finetune:interrupt-test": "true"})
    assert not allowed(bot, "fis:StartExperiment", template)


def test_the_bot_sends_refused_messages_to_its_dead_letter_queue_and_nowhere_else(bot: list[Statement]) -> None:
    """bot/sources/sqs.py finds the dead-letter queue from the redrive policy and sends a refused message there."""
    queue, dead_letters = att("EventsQueue"), att("EventsDeadLetterQueue")
    redrive = templates()["aws/finetune.yaml"]["Resources"]["EventsQueue"]["Properties"]["RedrivePolicy"]
    assert resolve(redrive["deadLetterTargetArn"]) == dead_letters
    for action in ("sqs:GetQueueUrl", "sqs:SendMessage"):
        assert allowed(bot, action, dead_letters)
        assert not allowed(bot, action, "arn:aws:sqs:us-east-1:123456789012:someone-elses")
    assert not allowed(bot, "sqs:SendMessage", queue)  # nothing the bot sends can pass for SNS's delivery
    for action in ("sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:PurgeQueue"):  # the evidence stays
        assert not allowed(bot, action, dead_letters)
    for action in ("sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:GetQueueAttributes"):
        assert allowed(bot, action, queue)


def test_the_bot_makes_and_deletes_only_its_own_placement_groups(bot: list[Statement]) -> None:
    group = "arn:aws:ec2:us-east-1:123456789012:placement-group/finetune-ft-1"
    other = group.replace("finetune-ft-1", "hpc-team")
    managed = {"aws:RequestTag/finetune:managed": "true"}
    assert allowed(bot, "ec2:CreatePlacementGroup", group, managed)
    assert not allowed(bot, "ec2:CreatePlacementGroup", group)  # untagged
    assert not allowed(bot, "ec2:CreatePlacementGroup", other, managed)
    assert allowed(bot, "ec2:CreateTags", group, {**managed, "ec2:CreateAction": "CreatePlacementGroup"})
    assert not allowed(bot, "ec2:CreateTags", other, {**managed, "ec2:CreateAction": "CreatePlacementGroup"})
    assert not allowed(bot, "ec2:CreateTags", group, {**managed, "ec2:CreateAction": "CreateTags"})
    ours = {"ec2:ResourceTag/finetune:managed": "true"}
    assert allowed(bot, "ec2:DeletePlacementGroup", group, ours)
    assert not allowed(bot, "ec2:DeletePlacementGroup", group)
    assert not allowed(bot, "ec2:DeletePlacementGroup", other, ours)
    assert allowed(bot, "ec2:RunInstances", group)  # a gang node launches into it
    assert not allowed(bot, "ec2:RunInstances", other)
    assert allowed(bot, "ec2:DescribeInstanceTypes", "*")


def test_the_bot_passes_each_role_only_to_its_service(bot: list[Statement]) -> None:
    runner, fis = att("RunnerRole"), att("FisRole")
    assert allowed(bot, "iam:PassRole", runner, {"iam:PassedToService": "ec2.amazonaws.com"})
    assert not allowed(bot, "iam:PassRole", runner, {"iam:PassedToService": "lambda.amazonaws.com"})
    assert allowed(bot, "iam:PassRole", fis, {"iam:PassedToService": "fis.amazonaws.com"})
    admin = "arn:aws:iam::123456789012:role/admin"
    assert not allowed(bot, "iam:PassRole", admin, {"iam:PassedToService": "ec2.amazonaws.com"})


# -- AWS: the runner ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def runner() -> list[Statement]:
    """The instance profile's role: what any process on a runner's instance may do."""
    return policy_of("aws/finetune.yaml", "RunnerRole")


@pytest.fixture(scope="module")
def storage() -> list[Statement]:
    """The runner storage role: what an attempt's storage session may do at most (its session policy narrows it)."""
    return policy_of("aws/finetune.yaml", "RunnerStorageRole")


STORAGE_BUCKET = "ft-ckpt"  # the bucket the session policy names (the role's statements name the stand-in BUCKET)


def session_of(job_id: str) -> list[Statement]:
    """The session policy the bot passes when it mints ``job_id``'s storage session (handlers/storage_sessions.py)."""
    document = session_policy(STORAGE_BUCKET, "jobs/", job_id)
    return [Statement(f"session {job_id}", body) for body in document["Statement"]]  # type: ignore[union-attr]


def session_may(storage: list[Statement], job_id: str, action: str, key: str | None, prefix: str = "") -> bool:
    """What ``job_id``'s session may do: what the role AND the session policy both allow (AWS's intersection).
    ``key`` None: ListBucket with ``s3:prefix`` ``prefix``."""
    session = session_of(job_id)
    if key is None:
        context = {"s3:prefix": prefix}
        return allowed(storage, action, BUCKET, context) and allowed(
            session, action, f"arn:aws:s3:::{STORAGE_BUCKET}", context
        )
    return allowed(storage, action, f"{BUCKET}/{key}") and allowed(
        session, action, f"arn:aws:s3:::{STORAGE_BUCKET}/{key}"
    )


@pytest.mark.parametrize("action", ["s3:PutObject", "s3:DeleteObject"])
def test_a_runner_never_writes_a_spec_or_a_control_object(storage: list[Statement], action: str) -> None:
    for key in ("jobs/ft-other/spec-attempt-2.json", "jobs/ft-other/control/attempt-2.json"):
        assert not allowed(storage, action, f"{BUCKET}/{key}")
    for key in ("jobs/ft-one/spec-attempt-2.json", "jobs/ft-one/control/attempt-2.json"):  # not its own job's either
        assert not session_may(storage, "ft-one", action, key)
    own = ("checkpoint-40/MANIFEST.json", "output/model.bin", "COMPLETED.json")
    for key in (f"jobs/ft-one/{name}" for name in own):
        assert allowed(storage, action, f"{BUCKET}/{key}")
        assert session_may(storage, "ft-one", action, key)


def test_an_attempts_session_reaches_its_own_job_only(storage: list[Statement]) -> None:
    """A runner of job A may write A's checkpoints and read A's spec; it may neither write (poison) B's checkpoints
    nor read B's spec or checkpoints, nor list B's prefix."""
    assert session_may(storage, "ft-aaa", "s3:PutObject", "jobs/ft-aaa/checkpoint-40/model.bin")
    assert session_may(storage, "ft-aaa", "s3:GetObject", "jobs/ft-aaa/spec-attempt-1.json")
    assert session_may(storage, "ft-aaa", "s3:ListBucket", None, "jobs/ft-aaa/")
    assert session_may(storage, "ft-aaa", "s3:ListBucket", None, "jobs/ft-aaa/checkpoint-40/")
    for action in ("s3:PutObject", "s3:DeleteObject", "s3:GetObject"):
        assert not session_may(storage, "ft-aaa", action, "jobs/ft-bbb/checkpoint-40/model.bin")
    assert not session_may(storage, "ft-aaa", "s3:GetObject", "jobs/ft-bbb/spec-attempt-1.json")
    assert not session_may(storage, "ft-aaa", "s3:GetObject", "jobs/ft-aaaa/spec-attempt-1.json")  # a longer id
    assert not session_may(storage, "ft-aaa", "s3:ListBucket", None, "jobs/ft-bbb/")
    assert not session_may(storage, "ft-aaa", "s3:ListBucket", None, "jobs/")
    assert not session_may(storage, "ft-aaa", "s3:GetObject", "attempt-keys/AROAEXAMPLERUNNERROLE:i-0bbb")
    # the role alone (no session policy) would reach B: the session policy is what holds a session to its job
    assert allowed(storage, "s3:PutObject", f"{BUCKET}/jobs/ft-bbb/checkpoint-40/model.bin")


def jobs_grants(policy: list[Statement]) -> list[str]:
    """Each Allow in ``policy`` that could reach an object or a listing under jobs/."""
    found = []
    for statement in policy:
        if statement.effect != "Allow" or not any(a.startswith(("s3:", "S3:")) for a in statement.actions):
            continue
        for resource in statement.resources:
            if resource == "*" or _glob(resource, f"{BUCKET}/jobs/ft-1/spec-attempt-1.json") or resource == BUCKET:
                found.append(f"{statement.where} {statement.body.get('Sid')}: {resource}")
    return found


def test_the_instance_profile_has_no_jobs_grant(runner: list[Statement]) -> None:
    """Every process on the instance has the instance profile: it reaches its key object, never a job object."""
    assert jobs_grants(runner) == []
    for action in ("s3:GetObject", "s3:PutObject", "s3:DeleteObject"):
        for key in ("jobs/ft-1/spec-attempt-1.json", "jobs/ft-1/checkpoint-40/model.bin", "jobs/ft-1/COMPLETED.json"):
            assert not allowed(runner, action, f"{BUCKET}/{key}")
    assert not allowed(runner, "s3:ListBucket", BUCKET, {"s3:prefix": "jobs/ft-1/"})
    # and the Deny holds against a grant someone adds later
    broader = [*runner, Statement("broader", {"Effect": "Allow", "Action": "s3:*", "Resource": f"{BUCKET}/*"})]
    assert not allowed(broader, "s3:PutObject", f"{BUCKET}/jobs/ft-1/checkpoint-40/model.bin")
    assert jobs_grants(broader) == ["broader None: arn:test:CheckpointBucket.Arn/*"]  # the check can fail


def test_only_the_bots_role_may_mint_storage_sessions(bot: list[Statement]) -> None:
    resource = templates()["aws/finetune.yaml"]["Resources"]["RunnerStorageRole"]
    (trust,) = resolve(resource["Properties"]["AssumeRolePolicyDocument"])["Statement"]
    assert trust["Principal"] == {"AWS": "arn:aws:iam::123456789012:root"} and trust["Action"] == "sts:AssumeRole"
    as_grant = Statement("trust", {k: v for k, v in trust.items() if k != "Principal"} | {"Resource": "*"})
    bot_role = f"arn:aws:iam::123456789012:role/{ref('BotRoleName')}"
    assert allowed([as_grant], "sts:AssumeRole", "*", {"aws:PrincipalArn": bot_role})
    assert not allowed([as_grant], "sts:AssumeRole", "*", {"aws:PrincipalArn": "arn:aws:iam::123456789012:role/x"})
    assert not allowed([as_grant], "sts:AssumeRole", "*")
    assert resource["Properties"]["MaxSessionDuration"] == 3600  # role chaining's cap in any case
    # the bot stack's task role is the role of that name, and the bot may assume the storage role and no other
    bot_stack = templates()["aws/bot.yaml"]["Resources"]["BotRole"]["Properties"]
    assert resolve(bot_stack["RoleName"]) == "import-ref-RunnerStackName-BotRoleName"
    assert allowed(bot, "sts:AssumeRole", att("RunnerStorageRole"))
    assert not allowed(bot, "sts:AssumeRole", att("RunnerRole"))
    assert not allowed(bot, "sts:AssumeRole", "arn:aws:iam::123456789012:role/admin")


def test_a_runner_reads_nothing_of_ssm_parameters(runner: list[Statement]) -> None:
    assert not allowed(runner, "s3:ListBucket", BUCKET, {"s3:prefix": "secrets/"})
    assert not allowed(runner, "ssm:GetParameter", "arn:aws:ssm:us-east-1:123456789012:parameter/finetune/x")
    assert allowed(runner, "ssmmessages:OpenDataChannel", "*")


ROLE_ID = "AROAEXAMPLERUNNERROLE"  # what ${aws:userid} starts with for the runner role's instance sessions


def on_instance(instance_id: str, tagged_for: str | None = None) -> dict[str, str]:
    """The request context of the runner role's session on ``instance_id`` reading a key object tagged for the
    session on ``tagged_for`` (None: an untagged object, or none there yet)."""
    context = {"aws:userid": f"{ROLE_ID}:{instance_id}"}
    if tagged_for is not None:
        context["s3:ExistingObjectTag/finetune:reader"] = f"{ROLE_ID}:{tagged_for}"
    return context


def key_of(instance_id: str) -> str:
    return f"{BUCKET}/attempt-keys/{ROLE_ID}:{instance_id}"


def test_a_runner_reads_the_key_object_of_its_own_instance_only(runner: list[Statement]) -> None:
    assert allowed(runner, "s3:GetObject", key_of("i-0aaa"), on_instance("i-0aaa", tagged_for="i-0aaa"))
    assert not allowed(runner, "s3:GetObject", key_of("i-0bbb"), on_instance("i-0aaa", tagged_for="i-0bbb"))
    assert not allowed(runner, "s3:GetObject", key_of("i-0aaa"), on_instance("i-0aaa"))  # untagged: nobody's
    assert not allowed(runner, "s3:GetObject", f"{BUCKET}/attempt-keys/{ROLE_ID}:i-0aaa-old", on_instance("i-0aaa"))
    assert not allowed(runner, "s3:GetObject", key_of("i-0aaa"), {})  # a session that names no instance
    for action in ("s3:PutObject", "s3:DeleteObject", "s3:PutObjectTagging", "s3:GetObjectTagging"):
        assert not allowed(runner, action, key_of("i-0aaa"), on_instance("i-0aaa", tagged_for="i-0aaa"))
    assert not allowed(runner, "s3:ListBucket", BUCKET, {"s3:prefix": "attempt-keys/"})


def test_no_key_is_readable_through_the_jobs_grant_and_the_deny_outlasts_a_broader_grant(
    runner: list[Statement], storage: list[Statement]
) -> None:
    (read_jobs,) = [s for s in storage if s.body.get("Sid") == "ReadJobs"]
    assert not allowed([read_jobs], "s3:GetObject", key_of("i-0bbb"), on_instance("i-0aaa", tagged_for="i-0bbb"))
    # Were the runner role one day to read the whole bucket, the Deny still keeps i-0bbb's key from i-0aaa.
    everything = Statement("broader", {"Effect": "Allow", "Action": "s3:GetObject", "Resource": f"{BUCKET}/*"})
    broader = [*runner, everything]
    assert not allowed(broader, "s3:GetObject", key_of("i-0bbb"), on_instance("i-0aaa", tagged_for="i-0bbb"))
    assert allowed(broader, "s3:GetObject", key_of("i-0aaa"), on_instance("i-0aaa", tagged_for="i-0aaa"))
    without_deny = [s for s in broader if s.body.get("Sid") != "NoOtherAttemptsKey"]  # the Deny is what does it
    assert allowed(without_deny, "s3:GetObject", key_of("i-0bbb"), on_instance("i-0aaa", tagged_for="i-0bbb"))


def test_the_bot_writes_and_deletes_key_objects_and_the_stack_says_the_role_id(bot: list[Statement]) -> None:
    for action in ("s3:PutObject", "s3:PutObjectTagging", "s3:DeleteObject"):
        assert allowed(bot, action, key_of("i-0aaa"))
    outputs = templates()["aws/finetune.yaml"]["Outputs"]
    assert resolve(outputs["RunnerRoleId"]["Value"]) == att("RunnerRole", "RoleId")


def test_a_runner_ends_and_scales_nothing(runner: list[Statement]) -> None:
    """An instance role cannot be limited to its own instance, so a runner may release nothing: the bot does."""
    tagged_instance = {"ec2:ResourceTag/finetune:managed": "true"}
    assert not allowed(runner, "ec2:TerminateInstances", AWS_INSTANCE, tagged_instance)
    assert not allowed(runner, "ec2:StopInstances", AWS_INSTANCE, tagged_instance)
    group = "arn:aws:autoscaling:us-east-1:123456789012:autoScalingGroup:u-1:autoScalingGroupName/finetune-ft-1"
    tagged = {"autoscaling:ResourceTag/finetune:managed": "true", "autoscaling:MinSize": "0"}
    for action in ("autoscaling:UpdateAutoScalingGroup", "autoscaling:SetDesiredCapacity"):
        assert not allowed(runner, action, group, tagged)


# -- Alibaba --------------------------------------------------------------------------------------------------


def aliyun_session_may(job_id: str, action: str, key: str | None, prefix: str = "") -> bool:
    """What ``job_id``'s STS token may do: what RunnerStorageRole AND the bot's inline policy both allow (RAM's
    intersection). ``key`` None: ListObjects with ``oss:Prefix`` ``prefix``."""
    role = policy_of("aliyun/finetune.ros.yaml", "RunnerStorageRole")
    document = aliyun_session_policy(STORAGE_BUCKET, "jobs/", job_id)
    session = [Statement(f"inline {job_id}", body) for body in document["Statement"]]  # type: ignore[union-attr]
    if key is None:
        context = {"oss:Prefix": prefix}
        bucket = f"acs:oss:*:*:{STORAGE_BUCKET}"
        return allowed(role, action, OSS, context) and allowed(session, action, bucket, context)
    return allowed(role, action, f"{OSS}/{key}") and allowed(session, action, f"acs:oss:*:*:{STORAGE_BUCKET}/{key}")


def test_an_alibaba_runner_never_writes_a_spec_or_a_control_object() -> None:
    storage = policy_of("aliyun/finetune.ros.yaml", "RunnerStorageRole")
    for action in ("oss:PutObject", "oss:DeleteObject"):
        assert not allowed(storage, action, f"{OSS}/jobs/ft-other/spec-attempt-1.json")
        assert not allowed(storage, action, f"{OSS}/jobs/ft-other/control/attempt-1.json")
        assert not aliyun_session_may("ft-abc1", action, "jobs/ft-abc1/spec-attempt-1.json")
        assert not aliyun_session_may("ft-abc1", action, "jobs/ft-abc1/control/attempt-1.json")
        assert aliyun_session_may("ft-abc1", action, "jobs/ft-abc1/checkpoint-40/MANIFEST.json")
    assert aliyun_session_may("ft-abc1", "oss:GetObject", "jobs/ft-abc1/spec-attempt-1.json")


def test_an_alibaba_attempts_token_reaches_its_own_job_only() -> None:
    """A runner of job A may write A's checkpoints and read A's spec; never B's objects, B's listing, or a key
    object (the bot's inline policy names only A's prefix)."""
    assert aliyun_session_may("ft-aaa", "oss:PutObject", "jobs/ft-aaa/checkpoint-40/model.bin")
    assert aliyun_session_may("ft-aaa", "oss:ListObjects", None, "jobs/ft-aaa/")
    assert aliyun_session_may("ft-aaa", "oss:ListObjects", None, "jobs/ft-aaa/checkpoint-40/")
    for action in ("oss:PutObject", "oss:DeleteObject", "oss:GetObject"):
        assert not aliyun_session_may("ft-aaa", action, "jobs/ft-bbb/checkpoint-40/model.bin")
    assert not aliyun_session_may("ft-aaa", "oss:GetObject", "jobs/ft-bbb/spec-attempt-1.json")
    assert not aliyun_session_may("ft-aaa", "oss:GetObject", "jobs/ft-aaaa/spec-attempt-1.json")  # a longer id
    assert not aliyun_session_may("ft-aaa", "oss:ListObjects", None, "jobs/ft-bbb/")
    assert not aliyun_session_may("ft-aaa", "oss:ListObjects", None, "jobs/")
    assert not aliyun_session_may("ft-aaa", "oss:GetObject", "attempt-keys/i-bp1bbb")
    # the role alone would reach B: the inline policy is what holds a token to its job
    storage = policy_of("aliyun/finetune.ros.yaml", "RunnerStorageRole")
    assert allowed(storage, "oss:PutObject", f"{OSS}/jobs/ft-bbb/checkpoint-40/model.bin")


def test_the_alibaba_instance_role_reads_key_objects_and_no_job_object() -> None:
    """Every process on the instance has its RAM role: sealed key objects only, and a Deny on jobs/ that holds
    against a grant added later."""
    runner = policy_of("aliyun/finetune.ros.yaml", "RunnerRole")
    assert allowed(runner, "oss:GetObject", f"{OSS}/attempt-keys/i-bp1aaa")
    assert not allowed(runner, "oss:PutObject", f"{OSS}/attempt-keys/i-bp1aaa")
    for action in ("oss:GetObject", "oss:PutObject", "oss:DeleteObject"):
        for key in ("jobs/ft-1/spec-attempt-1.json", "jobs/ft-1/checkpoint-40/model.bin", "jobs/ft-1/COMPLETED.json"):
            assert not allowed(runner, action, f"{OSS}/{key}")
    broader = [*runner, Statement("broader", {"Effect": "Allow", "Action": "oss:*", "Resource": f"{OSS}/*"})]
    assert not allowed(broader, "oss:PutObject", f"{OSS}/jobs/ft-1/checkpoint-40/model.bin")
    assert allowed(broader, "oss:PutObject", f"{OSS}/other/x")  # the check can fail


def test_only_the_alibaba_bots_role_may_mint_storage_tokens() -> None:
    resource = templates()["aliyun/finetune.ros.yaml"]["Resources"]["RunnerStorageRole"]["Properties"]
    (trust,) = resolve(resource["AssumeRolePolicyDocument"])["Statement"]
    assert trust["Principal"] == {"RAM": ["acs:ram::1234567890:role/finetune-bot"]}
    assert trust["Action"] == "sts:AssumeRole" and resource["MaxSessionDuration"] == 3600
    bot_role = templates()["aliyun/bot.ros.yaml"]["Resources"]["BotRole"]["Properties"]
    assert bot_role["RoleName"] == "finetune-bot"  # the name the trust names
    bot = policy_of("aliyun/finetune.ros.yaml", "BotPolicy")
    assert allowed(bot, "sts:AssumeRole", att("RunnerStorageRole"))
    assert not allowed(bot, "sts:AssumeRole", att("RunnerRole"))
    for action in ("oss:PutObject", "oss:DeleteObject"):
        assert allowed(bot, action, f"{OSS}/attempt-keys/i-bp1aaa")
    outputs = templates()["aliyun/finetune.ros.yaml"]["Outputs"]
    assert resolve(outputs["RunnerStorageRoleArn"]["Value"]) == att("RunnerStorageRole")
    config = templates()["aliyun/bot.ros.yaml"]["Resources"]["BotConfigSecret"]["Properties"]["SecretData"]["Fn::Sub"]
    assert "runner_storage_role_arn: ${RunnerStorageRoleArn}" in config


def test_the_alibaba_bot_launches_deletes_and_scales_only_what_is_ours() -> None:
    bot = policy_of("aliyun/finetune.ros.yaml", "BotPolicy")
    instance = "acs:ecs:cn-hangzhou:1234567890:instance/i-abc"
    assert allowed(bot, "ecs:RunInstances", instance, {"acs:RequestTag/finetune:managed": "true"})
    assert not allowed(bot, "ecs:RunInstances", instance)
    assert allowed(bot, "ecs:DeleteInstance", instance, {"acs:ResourceTag/finetune:managed": "true"})
    assert not allowed(bot, "ecs:DeleteInstance", instance)
    assert not allowed(bot, "ecs:TagResources", instance, {"acs:RequestTag/finetune:managed": "true"})
    ours = f"acs:ess:cn-hangzhou:1234567890:scalinggroup/{ref('ScalingGroup')}"
    assert allowed(bot, "ess:ModifyScalingGroup", ours)
    assert not allowed(bot, "ess:ModifyScalingGroup", "acs:ess:cn-hangzhou:1234567890:scalinggroup/asg-other")
    deployment_set = "acs:ecs:cn-hangzhou:1234567890:deploymentset/ds-bp1abc"
    assert allowed(bot, "ecs:CreateDeploymentSet", deployment_set)  # a gang's (ECS tags no deployment set)
    assert allowed(bot, "ecs:DeleteDeploymentSet", deployment_set)
    assert not allowed(bot, "ecs:DeleteDeploymentSet", instance)


def test_every_alibaba_statement_names_its_actions() -> None:
    for statement in all_statements():
        if statement.where.startswith("aliyun/"):
            assert listed(statement.body.get("Action")), statement.where


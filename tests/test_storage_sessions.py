"""Per-attempt storage sessions on AWS (moto in server mode): minted with a session policy naming only the job's
prefix, carried in the attempt's key object, and rewritten by the renewal loop well before they end.

moto's STS records what it was asked (``/moto-api/data.json``) but enforces no session policy, so the policy moto
received is also evaluated with tests/policy_eval.py, together with the runner storage role's own statements (a
session may do what both allow).
"""

from __future__ import annotations

import json
import urllib.request
from datetime import UTC, datetime, timedelta
from typing import Any

import boto3
import pytest
import redis.asyncio as aioredis

from bot.cloud.aws.provider import AwsCloud
from bot.errors import ConfigError
from bot.keys import Keys
from bot.storage_renewal import Renewed, StorageRenewal
from bot.store import JobStore
from handlers.attempt_keys import AttemptKey, parse_attempt_key
from handlers.change import Change
from handlers.jobs import Attempt, Job, JobState
from handlers.report_keys import ReportKeys
from handlers.storage_sessions import SESSION_SECONDS, dump_session_policy, session_policy
from runner.storage.attempt_credentials import ADVISORY_SECONDS
from tests.aws_fakes import Ec2Proxy
from tests.policy_eval import Statement, allowed, att, policy_of
from tests.redis_fixtures import (  # noqa: F401 (fixtures)
    fixture_key_prefix,
    fixture_redis_client,
    fixture_redis_client_factory,
    fixture_valkey_url,
)
from tests.s3_proxy import S3FaultProxy
from tests.test_aws_cloud import BUCKET, World, job_spec
from tests.test_aws_cloud import open_clouds as open_clouds
from tests.test_aws_cloud import proxy as proxy
from tests.test_aws_cloud import world as world

STORAGE_ROLE = "arn:aws:iam::123456789012:role/finetune-runner-storage"
TEMPLATE_BUCKET = att("CheckpointBucket")  # how the template's statements name the bucket (tests/policy_eval.py)


def storage_cloud(world: World, open_clouds: list[AwsCloud], keys: ReportKeys | None = None) -> AwsCloud:
    cloud = AwsCloud(world.settings(runner_storage_role_arn=STORAGE_ROLE), report_keys=keys or ReportKeys("master"))
    open_clouds.append(cloud)
    return cloud


def key_body(world: World, instance_id: str) -> AttemptKey:
    return parse_attempt_key(world.object(world.key_object_of(instance_id)))


def sessions_moto_minted(endpoint: str) -> list[dict[str, Any]]:
    """Every AssumeRole moto answered: session name, role, the session policy as sent, the access key it issued."""
    with urllib.request.urlopen(endpoint + "/moto-api/data.json") as reply:
        data = json.loads(reply.read())
    return list(data.get("sts", {}).get("AssumedRole", []))


def session_may(policy: str, action: str, key: str) -> bool:
    """What a session with ``policy`` may do to ``key``: the storage role's statements AND the session policy."""
    role = policy_of("aws/finetune.yaml", "RunnerStorageRole")
    session = [Statement("session", body) for body in json.loads(policy)["Statement"]]
    return allowed(role, action, f"{TEMPLATE_BUCKET}/{key}") and allowed(
        session, action, f"arn:aws:s3:::{BUCKET}/{key}"
    )


async def test_each_attempt_gets_a_session_of_the_storage_role_limited_to_its_own_jobs_prefix(
    world: World, proxy: Ec2Proxy, open_clouds: list[AwsCloud]
) -> None:
    cloud = storage_cloud(world, open_clouds)
    first = await cloud.launch(job_spec(cloud, "ft-aaa1", attempt=2), ["g5.xlarge"], "spot")
    other = await cloud.launch(job_spec(cloud, "ft-bbb1", attempt=1), ["g5.xlarge"], "spot")
    mine, theirs = key_body(world, first.instance_id), key_body(world, other.instance_id)
    assert mine.storage is not None and theirs.storage is not None
    assert mine.storage.access_key_id != theirs.storage.access_key_id

    minted = {entry["session_name"]: entry for entry in sessions_moto_minted(world.endpoint)}
    assert set(minted) == {"ft-aaa1.attempt-2", "ft-bbb1.attempt-1"}  # CloudTrail names job and attempt
    session = minted["ft-aaa1.attempt-2"]
    assert session["role_arn"] == STORAGE_ROLE
    assert session["access_key_id"] == mine.storage.access_key_id  # the object holds what STS issued for this attempt
    assert json.loads(session["policy"]) == session_policy(BUCKET, "jobs/", "ft-aaa1")
    assert session["policy"] == dump_session_policy(session_policy(BUCKET, "jobs/", "ft-aaa1"))

    # A's session may write A's checkpoint and read A's spec; never write B's checkpoint nor read B's spec.
    policy = session["policy"]
    assert session_may(policy, "s3:PutObject", "jobs/ft-aaa1/checkpoint-40/model.bin")
    assert session_may(policy, "s3:GetObject", "jobs/ft-aaa1/spec-attempt-2.json")
    assert not session_may(policy, "s3:PutObject", "jobs/ft-bbb1/checkpoint-40/model.bin")
    assert not session_may(policy, "s3:GetObject", "jobs/ft-bbb1/spec-attempt-1.json")
    assert not session_may(policy, "s3:PutObject", "jobs/ft-aaa1/spec-attempt-2.json")  # the role's object split

    # The credentials are real ones of moto's: they read and write the job's objects.
    s3 = boto3.client(
        "s3",
        endpoint_url=world.endpoint,
        region_name="us-east-1",
        aws_access_key_id=mine.storage.access_key_id,
        aws_secret_access_key=mine.storage.secret_access_key,
        aws_session_token=mine.storage.session_token,
    )
    assert b'"job_id":"ft-aaa1"' in s3.get_object(Bucket=BUCKET, Key="jobs/ft-aaa1/spec-attempt-2.json")["Body"].read()
    s3.put_object(Bucket=BUCKET, Key="jobs/ft-aaa1/checkpoint-1/weights.bin", Body=b"w")

    # The runner reads its key object before the spec: the user data says where it lies, and holds no credential.
    user_data = world.user_data(first.instance_id)
    assert f"FINETUNE_KEY_FROM=s3://{BUCKET}/attempt-keys/" in user_data
    assert mine.storage.secret_access_key not in user_data and mine.storage.session_token not in user_data
    assert mine.storage.secret_access_key not in world.object("jobs/ft-aaa1/spec-attempt-2.json").decode()


async def test_a_storage_role_without_report_keys_is_a_config_error(world: World) -> None:
    with pytest.raises(ConfigError, match="runner_storage_role_arn needs report keys"):
        AwsCloud(world.settings(runner_storage_role_arn=STORAGE_ROLE))


class Clock:
    """The bot's clock, stepped by the test."""

    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


async def test_the_renewal_loop_rewrites_every_live_attempts_credentials_well_before_they_end(
    world: World, proxy: Ec2Proxy, open_clouds: list[AwsCloud], redis_client: aioredis.Redis, key_prefix: str
) -> None:
    cloud = storage_cloud(world, open_clouds)
    store = JobStore(redis_client, Keys(key_prefix))
    live = await cloud.launch(job_spec(cloud, "ft-live1"), ["g5.xlarge"], "spot")
    over = await cloud.launch(job_spec(cloud, "ft-over1"), ["g5.xlarge"], "spot")
    at_launch = key_body(world, live.instance_id).storage
    assert at_launch is not None
    clock = Clock(at_launch.expiration - timedelta(seconds=SESSION_SECONDS))  # when the launch minted them
    for job_id, state, instance, ended in (
        ("ft-live1", JobState.RUNNING, live, None),
        ("ft-over1", JobState.SUCCEEDED, over, clock.now),
    ):
        attempt = Attempt(number=1, instance_id=instance.instance_id, launched_at=clock.now, ended_at=ended)
        job = Job(id=job_id, recipe="tiny", requested_by="console:ana", state=state, attempts=[attempt])
        assert await store.create(job, {"event": "created"})
    over_before = world.object(world.key_object_of(over.instance_id))

    renewal = StorageRenewal(redis_client, store, cloud, clock, owner="one")
    other_replica = StorageRenewal(redis_client, store, cloud, clock, owner="two")
    held, minted_at = at_launch, clock.now
    clock.now += timedelta(minutes=1)
    for _ in range(6):  # 90 minutes, well past the first session's end
        assert await renewal.round() == [Renewed("ft-live1", 1, live.instance_id)]
        fresh = key_body(world, live.instance_id).storage
        assert fresh is not None and fresh.access_key_id != held.access_key_id
        # rewritten while those it replaces (an hour's life from their minting) had far more left than the window
        # in which the runner starts asking for fresh ones
        assert SESSION_SECONDS - (clock.now - minted_at).total_seconds() > ADVISORY_SECONDS + 15 * 60
        held, minted_at = fresh, clock.now
        # within the period nobody renews again, this replica or another
        clock.now += timedelta(minutes=5)
        assert await other_replica.round() is None and await renewal.round() is None
        assert key_body(world, live.instance_id).storage == held
        clock.now += timedelta(minutes=10)  # the period (15 min) is over
    assert world.object(world.key_object_of(over.instance_id)) == over_before  # an ended attempt: left alone

    # The attempt ends: its renewals stop, and its key object is gone with its instance.
    await cloud.terminate(live.instance_id, "ft-live1")
    await store.apply("ft-live1", succeeded)
    clock.now += timedelta(minutes=20)
    assert await renewal.round() == []
    assert world.keys_under(world.key_object_of(live.instance_id)) == []


def succeeded(current: Job) -> Change:
    return Change(current.model_copy(update={"state": JobState.SUCCEEDED}), {"event": "succeeded"})


async def test_a_round_that_could_not_renew_an_attempt_does_not_count_and_the_next_look_tries_again(
    world: World,
    proxy: Ec2Proxy,
    open_clouds: list[AwsCloud],
    redis_client: aioredis.Redis,
    key_prefix: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    s3 = await S3FaultProxy(world.endpoint).start()
    try:
        monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3.endpoint)
        cloud = storage_cloud(world, open_clouds)
        store = JobStore(redis_client, Keys(key_prefix))
        live = await cloud.launch(job_spec(cloud, "ft-live2"), ["g5.xlarge"], "spot")
        before = key_body(world, live.instance_id).storage
        clock = Clock(datetime(2026, 5, 1, 12, 0, tzinfo=UTC))
        attempt = Attempt(number=1, instance_id=live.instance_id, launched_at=clock.now)
        job = Job(id="ft-live2", recipe="tiny", requested_by="console:ana", state=JobState.RUNNING, attempts=[attempt])
        assert await store.create(job, {"event": "created"})
        renewal = StorageRenewal(redis_client, store, cloud, clock)

        s3.refuse = lambda method, path: method == "PUT" and "/attempt-keys/" in path  # S3 refuses the rewrite
        assert await renewal.round() == []
        assert key_body(world, live.instance_id).storage == before
        s3.refuse = None
        clock.now += timedelta(minutes=5)  # the next look, a third of the period later: not "ran recently"
        assert await renewal.round() == [Renewed("ft-live2", 1, live.instance_id)]
        assert key_body(world, live.instance_id).storage != before
    finally:
        await s3.stop()

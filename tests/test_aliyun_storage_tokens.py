"""Per-attempt OSS tokens on Alibaba Cloud (the OpenAPI double, moto as the bucket): minted with STS AssumeRole and
an inline policy naming only the job's prefix, handed over sealed with the attempt's report key, renewed and taken
back.

The double's STS records the inline policy it received; no RAM emulator enforces it, so it is evaluated with
tests/policy_eval.py, together with the runner storage role's own statements (a token may do what both allow).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from bot.cloud.aliyun.provider import AliyunCloud
from bot.cloud.base import LaunchError, RenewsStorageCredentials
from bot.errors import CloudError, ConfigError
from handlers.attempt_keys import open_sealed
from handlers.report_keys import ReportKeys
from handlers.storage_sessions import aliyun_session_policy
from tests.aliyun_fakes import FakeAliyun, FakeToken
from tests.policy_eval import Statement, allowed, policy_of
from tests.test_aliyun_cloud import BUCKET, GPU, MASTER, SALT, job_spec, settings
from tests.test_aliyun_cloud import bucket as bucket
from tests.test_aliyun_cloud import fake as fake
from tests.test_aliyun_cloud import make_cloud as make_cloud

STORAGE_ROLE = "acs:ram::1234567890:role/finetune-runner-storage"
REPORT_URL = "https://bot.example.com/runner/reports"
TEMPLATE_OSS = "acs:oss:*:*:ref-BucketName"  # how the template's statements name the bucket (tests/policy_eval.py)


@pytest.fixture
def storage_cloud(fake: FakeAliyun, make_cloud: Callable[..., AliyunCloud]) -> AliyunCloud:
    fake.roles.add(STORAGE_ROLE)
    return make_cloud(runner_storage_role_arn=STORAGE_ROLE, report_url=REPORT_URL, sts_endpoint=fake.endpoint)


def sealed(bucket: Any, instance_id: str) -> bytes:
    body: bytes = bucket.get_object(Bucket=BUCKET, Key=f"attempt-keys/{instance_id}")["Body"].read()
    return body


def token_may(token: FakeToken, action: str, key: str | None, prefix: str = "") -> bool:
    """What the token may do: RunnerStorageRole AND the inline policy STS received (``key`` None: a listing)."""
    role = policy_of("aliyun/finetune.ros.yaml", "RunnerStorageRole")
    inline = [Statement("inline", body) for body in token.policy["Statement"]]
    if key is None:
        context = {"oss:Prefix": prefix}
        listing = f"acs:oss:*:*:{BUCKET}"
        return allowed(role, action, TEMPLATE_OSS, context) and allowed(inline, action, listing, context)
    return allowed(role, action, f"{TEMPLATE_OSS}/{key}") and allowed(inline, action, f"acs:oss:*:*:{BUCKET}/{key}")


async def test_a_launch_mints_a_token_of_the_jobs_prefix_and_hands_it_over_sealed(
    fake: FakeAliyun, bucket: Any, storage_cloud: AliyunCloud
) -> None:
    cloud = storage_cloud
    instance = await cloud.launch(job_spec(cloud, "ft-aaa1", 2), [GPU], "spot")

    (token,) = fake.assumed
    assert (token.role_arn, token.session_name, token.seconds) == (STORAGE_ROLE, "ft-aaa1.attempt-2", 3600)
    assert token.policy == aliyun_session_policy(BUCKET, "jobs/", "ft-aaa1")
    assert token_may(token, "oss:PutObject", "jobs/ft-aaa1/checkpoint-40/model.bin")
    assert token_may(token, "oss:GetObject", "jobs/ft-aaa1/spec-attempt-2.json")
    assert token_may(token, "oss:ListObjects", None, "jobs/ft-aaa1/checkpoint-40/")
    assert not token_may(token, "oss:PutObject", "jobs/ft-bbb1/checkpoint-40/model.bin")
    assert not token_may(token, "oss:GetObject", "jobs/ft-bbb1/spec-attempt-1.json")
    assert not token_may(token, "oss:ListObjects", None, "jobs/")
    assert not token_may(token, "oss:PutObject", "jobs/ft-aaa1/spec-attempt-2.json")  # the role's object split

    # The object is ciphertext: none of the token's bytes in it; the attempt's report key on its instance opens it.
    raw = sealed(bucket, instance.instance_id)
    for secret in (token.access_key_id, token.access_key_secret, token.security_token):
        assert secret.encode() not in raw
    keys = ReportKeys(MASTER)
    found = open_sealed(raw, keys.of("ft-aaa1", 2, SALT), instance.instance_id)
    assert (found.job_id, found.attempt) == ("ft-aaa1", 2)
    assert found.storage is not None
    assert (found.storage.access_key_id, found.storage.session_token) == (token.access_key_id, token.security_token)
    assert found.storage.expiration == token.expiration
    # ... and nothing else does: another attempt's key, or the object under another instance's name.
    for other in (keys.of("ft-aaa1", 1, SALT), keys.of("ft-bbb1", 2, SALT)):
        with pytest.raises(ValueError, match="does not open"):
            open_sealed(raw, other, instance.instance_id)
    with pytest.raises(ValueError, match="not i-bp0000000000"):
        open_sealed(raw, keys.of("ft-aaa1", 2, SALT), "i-bp0000000000")
    relabelled = json.loads(raw) | {"job_id": "ft-bbb1"}
    with pytest.raises(ValueError, match="does not open"):
        open_sealed(json.dumps(relabelled), keys.of("ft-aaa1", 2, SALT), instance.instance_id)

    # The user data says where the object lies and holds no part of the token.
    script = fake.instances[instance.instance_id].user_data
    assert f"FINETUNE_KEY_FROM=oss://{BUCKET}/attempt-keys/\n" in script
    for secret in (token.access_key_secret, token.security_token):
        assert secret not in script
    assert fake.rejected == []  # the AssumeRole request was signed like every other


async def test_renewal_rewrites_the_sealed_token_and_a_dropped_one_goes(
    fake: FakeAliyun, bucket: Any, storage_cloud: AliyunCloud
) -> None:
    cloud = storage_cloud
    assert isinstance(cloud, RenewsStorageCredentials) and cloud.renews_storage  # bot/service.py starts the loop
    instance = await cloud.launch(job_spec(cloud, "ft-aaa1", 1), [GPU], "spot")
    report_key = ReportKeys(MASTER).of("ft-aaa1", 1, SALT)
    first = open_sealed(sealed(bucket, instance.instance_id), report_key, instance.instance_id).storage

    await cloud.renew_storage_credentials("ft-aaa1", 1, instance.instance_id, key_salt=SALT)
    assert len(fake.assumed) == 2 and fake.assumed[1].session_name == "ft-aaa1.attempt-1"
    renewed = open_sealed(sealed(bucket, instance.instance_id), report_key, instance.instance_id).storage
    assert renewed is not None and first is not None
    assert renewed.access_key_id == fake.assumed[1].access_key_id != first.access_key_id

    await cloud.drop_storage_credentials(instance.instance_id)
    assert bucket.list_objects_v2(Bucket=BUCKET, Prefix="attempt-keys/").get("KeyCount") == 0


async def test_a_refused_renewal_is_a_cloud_error_and_the_object_stays(
    fake: FakeAliyun, bucket: Any, storage_cloud: AliyunCloud
) -> None:
    cloud = storage_cloud
    instance = await cloud.launch(job_spec(cloud), [GPU], "spot")
    before = sealed(bucket, instance.instance_id)
    fake.roles.clear()
    with pytest.raises(CloudError, match=r"could not renew the storage token.*NoPermission"):
        await cloud.renew_storage_credentials("ft-abc1", 1, instance.instance_id, key_salt=SALT)
    assert sealed(bucket, instance.instance_id) == before


async def test_an_instance_that_gets_no_token_is_released(
    fake: FakeAliyun, bucket: Any, make_cloud: Callable[..., AliyunCloud]
) -> None:
    cloud = make_cloud(runner_storage_role_arn=STORAGE_ROLE, report_url=REPORT_URL, sts_endpoint=fake.endpoint)
    # (the role is not among those the double lets this caller assume)
    with pytest.raises(LaunchError, match=r"could not hand ft-abc1 attempt 1 its storage token.*NoPermission"):
        await cloud.launch(job_spec(cloud), [GPU], "spot")
    (started,) = fake.instances
    assert fake.deleted == [started] and fake.live() == []
    assert bucket.list_objects_v2(Bucket=BUCKET, Prefix="attempt-keys/").get("KeyCount") == 0


async def test_terminate_takes_the_sealed_token_back(fake: FakeAliyun, bucket: Any, storage_cloud: AliyunCloud) -> None:
    cloud = storage_cloud
    instance = await cloud.launch(job_spec(cloud), [GPU], "spot")
    assert sealed(bucket, instance.instance_id)
    await cloud.terminate(instance.instance_id, "ft-abc1")
    assert bucket.list_objects_v2(Bucket=BUCKET, Prefix="attempt-keys/").get("KeyCount") == 0


def test_a_storage_role_needs_report_keys_a_report_url_and_an_instance_role(fake: FakeAliyun, aws: str) -> None:
    with pytest.raises(ConfigError, match="runner_storage_role_arn needs report keys"):
        AliyunCloud(settings(fake, aws, runner_storage_role_arn=STORAGE_ROLE, report_url=REPORT_URL))
    with pytest.raises(ValueError, match=r"needs ram_role .* and report_url"):
        settings(fake, aws, runner_storage_role_arn=STORAGE_ROLE)
    with pytest.raises(ValueError, match="needs ram_role"):
        settings(fake, aws, runner_storage_role_arn=STORAGE_ROLE, report_url=REPORT_URL, ram_role=None)
    with pytest.raises(ValueError, match="runner_storage_role_arn"):
        settings(fake, aws, runner_storage_role_arn="arn:aws:iam::123456789012:role/x", report_url=REPORT_URL)
    without = AliyunCloud(settings(fake, aws), report_keys=ReportKeys(MASTER))
    assert not without.renews_storage
    script = without.user_data("oss://ft-oss/jobs/ft-abc1/spec-attempt-1.json", "ft-abc1", 1, SALT)
    assert "FINETUNE_KEY_FROM" not in script

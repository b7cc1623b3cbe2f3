"""AWS: what one attempt's storage session may touch, and what it is called: the job's own prefix, nothing else.

An instance-profile session names its instance, never its job, so an instance role cannot be held to one job's
objects. The bot can: per attempt it assumes the runner storage role (deploy/aws/finetune.yaml RunnerStorageRole)
with a *session policy* naming only ``<prefix><job id>/``. A session's permissions are the intersection of the
role's policy (the object-kind split: checkpoints, outputs and the completion record written, specs and control
objects never) and this session policy (this job only), so a runner of job A can neither read B's spec nor write
B's checkpoints. The bot's own session is role-chained into this one, which AWS caps at one hour: the bot rewrites
the credentials well before that (bot/storage_renewal.py).

Alibaba: the same with RAM. The bot's RAM role assumes the runner storage role (deploy/aliyun/finetune.ros.yaml
RunnerStorageRole, the object-kind split) with an inline ``Policy`` naming only ``acs:oss:*:*:<bucket>/<prefix><job
id>/*`` and a listing of that prefix (:func:`aliyun_session_policy`); STS grants the intersection, as on AWS.
"""

from __future__ import annotations

import json
import re

from handlers.ids import JOB_ID_PATTERN

SESSION_SECONDS = 3600  # AWS's cap for a role-chained session
RENEW_SECONDS = 15 * 60  # the bot rewrites every live attempt's credentials this often: they keep >= 40 min
OBJECT_ACTIONS = ("s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload")
ROLE_ARN_PATTERN = r"^arn:aws[a-z-]*:iam::\d{12}:role/[A-Za-z0-9+=,.@_/-]{1,512}$"
ALIYUN_ROLE_ARN_PATTERN = r"^acs:ram::\d{1,20}:role/[A-Za-z0-9.-]{1,64}$"
ALIYUN_OBJECT_ACTIONS = (
    "oss:GetObject",
    "oss:PutObject",
    "oss:DeleteObject",
    "oss:AbortMultipartUpload",
    "oss:ListParts",
)
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_PREFIX = re.compile(r"([A-Za-z0-9._-]+/)*")


def partition_of(role_arn: str) -> str:
    """``aws``, ``aws-cn``, ``aws-us-gov``: the partition the role (hence the bucket) lives in."""
    if not re.fullmatch(ROLE_ARN_PATTERN, role_arn):
        raise ValueError(f"{role_arn!r} is not an IAM role ARN")
    return role_arn.split(":", 2)[1]


def job_prefix(prefix: str, job_id: str) -> str:
    """``jobs/ft-abc1/``: the one prefix the attempt's session may use."""
    if not _PREFIX.fullmatch(prefix):
        raise ValueError(f"{prefix!r} is not a key prefix of plain names ending in /")
    if not re.fullmatch(JOB_ID_PATTERN, job_id):
        raise ValueError(f"{job_id!r} is not a job id")
    return f"{prefix}{job_id}/"


def session_policy(bucket: str, prefix: str, job_id: str, partition: str = "aws") -> dict[str, object]:
    """The session policy of one attempt: objects under the job's prefix, and listing only that prefix."""
    if not _BUCKET.fullmatch(bucket):
        raise ValueError(f"{bucket!r} is not a bucket name")
    own = job_prefix(prefix, job_id)
    bucket_arn = f"arn:{partition}:s3:::{bucket}"
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "ThisJobsObjects",
                "Effect": "Allow",
                "Action": list(OBJECT_ACTIONS),
                "Resource": f"{bucket_arn}/{own}*",
            },
            {
                "Sid": "ListThisJob",
                "Effect": "Allow",
                "Action": "s3:ListBucket",
                "Resource": bucket_arn,
                "Condition": {"StringLike": {"s3:prefix": [f"{own}*"]}},
            },
        ],
    }


def aliyun_session_policy(bucket: str, prefix: str, job_id: str) -> dict[str, object]:
    """The inline policy of one attempt's RAM STS token: objects under the job's prefix, and listing only that prefix
    (RAM's ``oss:Prefix`` condition key)."""
    if not _BUCKET.fullmatch(bucket):
        raise ValueError(f"{bucket!r} is not a bucket name")
    own = job_prefix(prefix, job_id)
    return {
        "Version": "1",
        "Statement": [
            {"Effect": "Allow", "Action": list(ALIYUN_OBJECT_ACTIONS), "Resource": [f"acs:oss:*:*:{bucket}/{own}*"]},
            {
                "Effect": "Allow",
                "Action": ["oss:ListObjects"],
                "Resource": [f"acs:oss:*:*:{bucket}"],
                "Condition": {"StringLike": {"oss:Prefix": [f"{own}*"]}},
            },
        ],
    }


def dump_session_policy(policy: dict[str, object]) -> str:
    """Compact JSON: STS counts the packed size of a session policy against its limit."""
    return json.dumps(policy, separators=(",", ":"))


def session_name(job_id: str, attempt: int) -> str:
    """What CloudTrail shows for every request of the session: ``ft-abc1.attempt-3`` (at most 64 characters)."""
    if not re.fullmatch(JOB_ID_PATTERN, job_id) or not 1 <= attempt <= 10_000:
        raise ValueError(f"no session name for job {job_id!r} attempt {attempt!r}")
    return f"{job_id}.attempt-{attempt}"

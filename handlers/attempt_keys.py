"""AWS: the object that hands one attempt's report key to that attempt's instance, and to no other.

An instance-profile session says which instance it is (``${aws:userid}`` is ``<role id>:<instance id>``) but not
which job it runs, so the key cannot live in the spec (without a storage role every runner may read every spec).
The bot writes it to
``attempt-keys/<runner role id>:<instance id>`` as soon as it knows the attempt's instance, tagged
``finetune:reader=<role id>:<instance id>``; the runner role may read only ``attempt-keys/${aws:userid}``, and a
Deny refuses any key object whose tag does not name the reader (deploy/aws/finetune.yaml). The runner checks that
the object names its own job and attempt before it signs with the key. Both sides use this one definition.

With a runner storage role (``aws.runner_storage_role_arn``) the object also carries the attempt's storage
credentials: an STS session of that role limited to the job's own prefix (:mod:`handlers.storage_sessions`), which
the bot rewrites before they expire (bot/storage_renewal.py) and the runner reads again as they near their end
(runner/storage/attempt_credentials.py). Without them (a stack without the role) the runner uses its ambient
credentials.
"""

from __future__ import annotations

import re
from datetime import datetime

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, ValidationError

from handlers.ids import JOB_ID_PATTERN
from handlers.spec import ATTEMPT_KEYS_PREFIX

READER_TAG = "finetune:reader"  # the key object's tag: the one ${aws:userid} that may read it
ROLE_ID_PATTERN = r"^AROA[0-9A-Z]{4,124}$"
INSTANCE_ID = re.compile(r"i-[0-9a-f]{8,17}")


class StorageCredentials(BaseModel):
    """An STS session's credentials, as AssumeRole returns them (an aware ``expiration``): AWS's (``ASIA…``) or
    Alibaba's (``STS.…``, mixed case)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    access_key_id: str = Field(pattern=r"^(STS\.)?[A-Za-z0-9]{16,128}$")
    secret_access_key: str = Field(repr=False, min_length=16, max_length=256)
    session_token: str = Field(repr=False, min_length=16, max_length=8192)
    expiration: AwareDatetime

    def seconds_left(self, now: datetime) -> float:
        return (self.expiration - now).total_seconds()


class AttemptKey(BaseModel):
    """The key object's body: whose key it is, the key, and (with a storage role) the attempt's storage session."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    job_id: str = Field(pattern=JOB_ID_PATTERN)
    attempt: int = Field(ge=1, le=10_000)
    key: str = Field(repr=False, min_length=32, max_length=128, pattern=r"^[0-9a-f]+$")
    storage: StorageCredentials | None = None


def reader(role_id: str, instance_id: str) -> str:
    """What ``${aws:userid}`` is for a session of the runner role on ``instance_id``."""
    if not re.fullmatch(ROLE_ID_PATTERN, role_id):
        raise ValueError(f"{role_id!r} is not an IAM role's unique id (AROA…)")
    if not INSTANCE_ID.fullmatch(instance_id):
        raise ValueError(f"{instance_id!r} is not an EC2 instance id")
    return f"{role_id}:{instance_id}"


def key_object(role_id: str, instance_id: str) -> str:
    """The key object's name in the bucket."""
    return ATTEMPT_KEYS_PREFIX + reader(role_id, instance_id)


def dump_attempt_key(job_id: str, attempt: int, key: str, storage: StorageCredentials | None = None) -> bytes:
    """The body (``storage`` only where there are storage credentials)."""
    return (
        AttemptKey(job_id=job_id, attempt=attempt, key=key, storage=storage).model_dump_json(exclude_none=True).encode()
    )


def parse_attempt_key(raw: bytes | str) -> AttemptKey:
    """The key object's body; ValueError (without the key in it) when it is malformed."""
    try:
        return AttemptKey.model_validate_json(raw)
    except ValidationError as exc:
        fields = ", ".join(".".join(map(str, error["loc"])) or "body" for error in exc.errors())
        raise ValueError(f"malformed key object ({fields})") from None

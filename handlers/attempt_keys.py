"""The object that hands one attempt's report key to that attempt's instance, and to no other: one body, two guards.

AWS, by tag: an instance-profile session says which instance it is (``${aws:userid}`` is ``<role id>:<instance
id>``) but not which job it runs, so the key cannot live in the spec (without a storage role every runner may read
every spec). The bot writes it to ``attempt-keys/<runner role id>:<instance id>`` as soon as it knows the attempt's
instance, tagged ``finetune:reader=<role id>:<instance id>``; the runner role may read only
``attempt-keys/${aws:userid}``, and a Deny refuses any key object whose tag does not name the reader
(deploy/aws/finetune.yaml). The runner checks that the object names its own job and attempt before it signs with
the key. Both sides use this one definition.

With a runner storage role (``aws.runner_storage_role_arn``) the object also carries the attempt's storage
credentials: an STS session of that role limited to the job's own prefix (:mod:`handlers.storage_sessions`), which
the bot rewrites before they expire (bot/storage_renewal.py) and the runner reads again as they near their end
(runner/storage/attempt_credentials.py). Without them (a stack without the role) the runner uses its ambient
credentials.

Alibaba, sealed: a RAM role cannot be held to one instance's objects the way AWS's ``${aws:userid}`` and object
tags hold a runner to its key object, so every runner's instance role may read every object under
``attempt-keys/``. What keeps an attempt's STS token (:mod:`handlers.storage_sessions`, limited to its job's
prefix) from the other instances is encryption: the bot writes ``attempt-keys/<instance id>`` as AES-256-GCM
ciphertext under a key derived from that attempt's report key (which only that instance holds, in its own user
data: bot/cloud/aliyun/provider.py), with the job, the attempt and the instance as associated data. Another
attempt's runner reads bytes it cannot open, and a sealed object moved to another instance's name, or relabelled
with another job, fails to open. Inside is the same body AWS's key object carries (:func:`dump_attempt_key`), so
the runner's refreshable credentials read both once :func:`open_sealed` has opened it.

The cipher (``cryptography``, a fifth of a second to import) is loaded by the first seal or open: every runner
imports this module for its key object and key-prefix pattern, and only an Alibaba runner with a storage role
opens anything.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import re
from datetime import datetime
from typing import Literal

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


# -- Alibaba: the sealed object -----------------------------------------------------------------------------------

SEALING_INFO = b"finetune-storage/v1"  # what the report key is HMACed with: a key for this use only
ECS_INSTANCE_ID = re.compile(r"i-[0-9a-z]{8,30}")
NONCE_BYTES = 12
# FINETUNE_KEY_FROM on Alibaba: oss://<bucket>/attempt-keys/ (the runner appends its instance id)
SEALED_KEY_PREFIX_PATTERN = r"^oss://[a-z0-9][a-z0-9-]{1,61}[a-z0-9]/attempt-keys/$"
_B64 = r"^[A-Za-z0-9+/]+={0,2}$"


class SealedKey(BaseModel):
    """The object's body: whose it says it is (in the clear, and bound to the ciphertext), and the ciphertext."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    v: Literal[1] = 1
    job_id: str = Field(pattern=JOB_ID_PATTERN)
    attempt: int = Field(ge=1, le=10_000)
    instance_id: str = Field(pattern=r"^i-[0-9a-z]{8,30}$")
    nonce: str = Field(pattern=_B64, min_length=16, max_length=16)
    sealed: str = Field(pattern=_B64, min_length=24, max_length=16_384)


def sealed_key_object(instance_id: str) -> str:
    """The object's name in the bucket: ``attempt-keys/<instance id>``."""
    if not ECS_INSTANCE_ID.fullmatch(instance_id):
        raise ValueError(f"{instance_id!r} is not an ECS instance id")
    return ATTEMPT_KEYS_PREFIX + instance_id


def sealing_key(report_key: str) -> bytes:
    """HMAC-SHA256(report key, ``finetune-storage/v1``): 32 bytes, an AES-256 key that signs nothing."""
    return hmac.new(report_key.encode(), SEALING_INFO, hashlib.sha256).digest()


def _associated(job_id: str, attempt: int, instance_id: str) -> bytes:
    return json.dumps([job_id, attempt, instance_id], separators=(",", ":")).encode()


def seal(report_key: str, instance_id: str, job_id: str, attempt: int, storage: StorageCredentials) -> bytes:
    """The sealed object for ``instance_id`` running ``job_id`` attempt ``attempt`` (a fresh nonce every time)."""
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    sealed_key_object(instance_id)  # the name check
    plain = dump_attempt_key(job_id, attempt, report_key, storage)
    nonce = os.urandom(NONCE_BYTES)
    ciphertext = AESGCM(sealing_key(report_key)).encrypt(nonce, plain, _associated(job_id, attempt, instance_id))
    body = SealedKey(
        job_id=job_id,
        attempt=attempt,
        instance_id=instance_id,
        nonce=base64.b64encode(nonce).decode(),
        sealed=base64.b64encode(ciphertext).decode(),
    )
    return body.model_dump_json().encode()


def unseal(raw: bytes | str, report_key: str, instance_id: str) -> bytes:
    """The object's plaintext (an attempt key body, :func:`parse_attempt_key` reads it), when
    ``report_key`` and ``instance_id`` are the ones it was sealed for; ValueError (with no secret in it) when it is
    malformed, another instance's, or sealed with another attempt's key."""
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    try:
        body = SealedKey.model_validate_json(raw)
    except ValidationError as exc:
        fields = ", ".join(".".join(map(str, error["loc"])) or "body" for error in exc.errors())
        raise ValueError(f"malformed sealed key object ({fields})") from None
    if body.instance_id != instance_id:
        raise ValueError(f"the sealed key object is {body.instance_id}'s, not {instance_id}'s")
    try:
        plain = AESGCM(sealing_key(report_key)).decrypt(
            base64.b64decode(body.nonce),
            base64.b64decode(body.sealed),
            _associated(body.job_id, body.attempt, instance_id),
        )
    except (InvalidTag, ValueError):
        raise ValueError(
            f"the sealed key object of {body.job_id} attempt {body.attempt} does not open with this attempt's report "
            "key (another attempt's, or altered)"
        ) from None
    found = parse_attempt_key(plain)
    if (found.job_id, found.attempt) != (body.job_id, body.attempt):
        raise ValueError("the sealed key object's label and its content name different attempts")
    return plain


def open_sealed(raw: bytes | str, report_key: str, instance_id: str) -> AttemptKey:
    """What the object holds (:func:`unseal`, parsed)."""
    return parse_attempt_key(unseal(raw, report_key, instance_id))

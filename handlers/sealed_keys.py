"""Alibaba: the object that hands one attempt's storage token to that attempt's runner, sealed so no other can open it.

A RAM role cannot be held to one instance's objects the way AWS's ``${aws:userid}`` and object tags hold a runner
to its key object, so every runner's instance role may read every object under ``attempt-keys/``. What keeps an
attempt's STS token (:mod:`handlers.storage_sessions`, limited to its job's prefix) from the other instances is
encryption: the bot writes ``attempt-keys/<instance id>`` as AES-256-GCM ciphertext under a key derived from that
attempt's report key (which only that instance holds, in its own user data: bot/cloud/aliyun/provider.py), with the job,
the attempt and the instance as associated data. Another attempt's runner reads bytes it cannot open, and a sealed
object moved to another instance's name, or relabelled with another job, fails to open.

Inside is the same body AWS's key object carries (:func:`handlers.attempt_keys.dump_attempt_key`), so the runner's
refreshable credentials (runner/storage/attempt_credentials.py) read both once this module has opened it.

The cipher (``cryptography``, a fifth of a second to import) is loaded by the first seal or open: every runner
imports this module for its key-prefix pattern, and only an Alibaba runner with a storage role opens anything.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from handlers.attempt_keys import AttemptKey, StorageCredentials, dump_attempt_key, parse_attempt_key
from handlers.ids import JOB_ID_PATTERN
from handlers.spec import ATTEMPT_KEYS_PREFIX

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
    """The object's plaintext (an attempt key body, :func:`handlers.attempt_keys.parse_attempt_key` reads it), when
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

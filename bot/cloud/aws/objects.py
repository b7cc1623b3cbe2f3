"""What the AWS provider writes to S3: the attempt's spec, its key object and the runner's control object.

Once the instance id is known, the attempt's report key goes to the one object that instance may read
(:mod:`handlers.attempt_keys`), deleted again when the instance is released. With a runner storage role that object
also carries the attempt's storage session, limited to the job's own prefix (:mod:`handlers.storage_sessions`) and
rewritten before it expires (driven by bot/storage_renewal.py).

S3 refusing or not answering a write or delete comes out as :class:`~bot.errors.CloudRefused` or
:class:`~bot.errors.CloudUnavailable` naming the object, mapped by :func:`bot.cloud.aws.errors.object_errors` exactly
as OSS's are; STS not issuing a storage session is a :class:`~bot.errors.CloudError`. The provider
(``bot/cloud/aws/provider.py``) turns either into the cloud port's error for what it was doing.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from urllib.parse import urlencode

from bot.cloud.aws.clients import AwsClients
from bot.cloud.aws.settings import AwsSettings
from bot.errors import CloudError, CloudRefused, CloudUnavailable
from handlers.attempt_keys import READER_TAG, StorageCredentials, dump_attempt_key, key_object, reader
from handlers.report_keys import ReportKeys
from handlers.spec import (
    ATTEMPT_KEYS_PREFIX,
    AnyControl,
    GoControl,
    JobSpec,
    RegroupControl,
    StopControl,
    control_key,
    dump_control,
    node_control_key,
)
from handlers.storage_sessions import SESSION_SECONDS, dump_session_policy, partition_of, session_name, session_policy

log = logging.getLogger(__name__)

# A key object (or its session) that could not be written: S3's, STS's, or a session policy that would not build.
KEY_FAILURES = (CloudError, ValueError)


class AwsObjects:
    """The bot's S3 objects of each attempt, in ``bucket`` under ``prefix``."""

    def __init__(self, settings: AwsSettings, clients: AwsClients, report_keys: ReportKeys | None) -> None:
        self.settings = settings
        self.clients = clients
        self.report_keys = report_keys

    def spec_key(self, job_id: str, attempt: int) -> str:
        return f"{self.settings.prefix}{job_id}/spec-attempt-{attempt}.json"

    def control_key(self, job_id: str, attempt: int) -> str:
        """The runner's control object, relative to the bucket (the runner reads it relative to its checkpoints)."""
        return f"{self.settings.prefix}{job_id}/{control_key(attempt)}"

    def node_control_key(self, job_id: str, attempt: int, generation: int, node_rank: int) -> str:
        """A gang node's own control object of one generation, relative to the bucket (beside the attempt's)."""
        return f"{self.settings.prefix}{job_id}/{node_control_key(attempt, generation, node_rank)}"

    def key_prefix_uri(self) -> str | None:
        """Where the runners find their keys (the spec's ``report_key_from``): the runner appends its instance id."""
        role_id = self.settings.runner_role_id
        if self.report_keys is None or role_id is None:
            return None
        return f"s3://{self.settings.bucket}/{ATTEMPT_KEYS_PREFIX}{role_id}:"

    @property
    def renews_storage(self) -> bool:
        """Whether runners get per-attempt storage sessions (which then need rewriting before they expire)."""
        return self.settings.runner_storage_role_arn is not None

    def uri(self, key: str) -> str:
        return f"s3://{self.settings.bucket}/{key}"

    async def upload_spec(self, spec: JobSpec) -> str:
        """The attempt's spec, where its runner reads it; its ``s3://`` URI. CloudRefused or CloudUnavailable when
        S3 would not."""
        key = self.spec_key(spec.job_id, spec.attempt)
        await self._put(key, spec.model_dump_json().encode())
        return self.uri(key)

    async def write_key(self, job_id: str, attempt: int, key_salt: str, instance_id: str) -> None:
        """Write the attempt's key (derived with its ``key_salt``; with a storage role, a fresh storage session too)
        where only ``instance_id``'s runner may read it; nothing without report keys. One of :data:`KEY_FAILURES`
        when it cannot."""
        role_id = self.settings.runner_role_id
        if self.report_keys is None or role_id is None:
            return
        storage = await self._storage_session(job_id, attempt) if self.renews_storage else None
        await self._put(
            key_object(role_id, instance_id),
            dump_attempt_key(job_id, attempt, self.report_keys.of(job_id, attempt, key_salt), storage),
            # the runner role's Deny refuses a key object whose tag does not name the session reading it
            tagging=urlencode({READER_TAG: reader(role_id, instance_id)}),
        )

    async def _storage_session(self, job_id: str, attempt: int) -> StorageCredentials:
        """An STS session of the runner storage role limited to the job's prefix, for one hour (role chaining's cap),
        named after the job and attempt so CloudTrail says whose each request was."""
        role = self.settings.runner_storage_role_arn
        if role is None:
            raise ValueError("no aws.runner_storage_role_arn")
        policy = session_policy(self.settings.bucket, self.settings.prefix, job_id, partition_of(role))
        sts = await self.clients.get("sts")
        try:
            reply = await sts.assume_role(
                RoleArn=role,
                RoleSessionName=session_name(job_id, attempt),
                Policy=dump_session_policy(policy),
                DurationSeconds=SESSION_SECONDS,
            )
        except (CloudRefused, CloudUnavailable) as exc:
            raise CloudError(f"STS did not issue a storage session of {role} for {job_id}: {exc}") from exc
        found = reply["Credentials"]
        expiration = found["Expiration"]
        if isinstance(expiration, datetime) and expiration.tzinfo is None:
            expiration = expiration.replace(tzinfo=UTC)
        return StorageCredentials(
            access_key_id=found["AccessKeyId"],
            secret_access_key=found["SecretAccessKey"],
            session_token=found["SessionToken"],
            expiration=expiration,
        )

    async def delete_key(self, instance_id: str) -> None:
        """Best effort, idempotent: the key object of a released instance goes (the bucket expires strays)."""
        role_id = self.settings.runner_role_id
        if self.report_keys is None or role_id is None:
            return
        key = key_object(role_id, instance_id)
        try:
            s3 = await self.clients.get("s3")
            await s3.delete_object(Bucket=self.settings.bucket, Key=key)
        except (CloudRefused, CloudUnavailable) as exc:
            log.warning("could not delete the key object of %s: %s", instance_id, exc)

    async def put_stop(self, job_id: str, attempt: int) -> None:
        """:class:`~handlers.spec.StopControl` in the attempt's control object, which its runner polls;
        CloudRefused or CloudUnavailable when S3 would not take it."""
        await self._put(self.control_key(job_id, attempt), dump_control(StopControl()))

    async def put_control(self, job_id: str, attempt: int, control: AnyControl) -> None:
        """``control`` in the attempt's control object, which its runner polls; CloudRefused or CloudUnavailable
        when S3 would not take it."""
        await self._put(self.control_key(job_id, attempt), dump_control(control))

    async def put_go(self, job_id: str, attempt: int) -> None:
        """:class:`~handlers.spec.GoControl` in the attempt's control object, where a runner launched ahead of a
        switch of market waits; CloudRefused or CloudUnavailable when S3 would not take it."""
        await self._put(self.control_key(job_id, attempt), dump_control(GoControl()))

    async def put_node_control(
        self, job_id: str, attempt: int, generation: int, node_rank: int, control: RegroupControl
    ) -> str:
        """A gang node's regroup in its own control object, which its runner polls; the key written.
        CloudRefused or CloudUnavailable when S3 would not take it."""
        key = self.node_control_key(job_id, attempt, generation, node_rank)
        await self._put(key, dump_control(control))
        return key

    async def _put(self, key: str, body: bytes, *, tagging: str | None = None) -> None:
        """One JSON object written whole; S3's failures as the cloud's errors naming it."""
        extra = {"Tagging": tagging} if tagging is not None else {}
        s3 = await self.clients.get("s3")
        await s3.put_object(Bucket=self.settings.bucket, Key=key, Body=body, ContentType="application/json", **extra)

"""What the AWS provider writes to S3: the attempt's spec, its key object and the runner's control object.

Once the instance id is known, the attempt's report key goes to the one object that instance may read
(:mod:`handlers.attempt_keys`), deleted again when the instance is released. With a runner storage role that object
also carries the attempt's storage session, limited to the job's own prefix (:mod:`handlers.storage_sessions`) and
rewritten before it expires (driven by bot/storage_renewal.py).
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from urllib.parse import urlencode

from botocore.exceptions import BotoCoreError, ClientError
from botocore.parsers import ResponseParserError

from bot.cloud.aws_clients import NO_ANSWER, AwsClients, AwsError
from bot.cloud.aws_settings import AwsSettings
from bot.cloud.base import LaunchError
from handlers.attempt_keys import READER_TAG, StorageCredentials, dump_attempt_key, key_object, reader
from handlers.report_keys import ReportKeys
from handlers.spec import ATTEMPT_KEYS_PREFIX, JobSpec, StopControl, control_key, dump_control
from handlers.storage_sessions import SESSION_SECONDS, dump_session_policy, partition_of, session_name, session_policy

log = logging.getLogger(__name__)

KEY_FAILURES = (ClientError, *NO_ANSWER, ValueError)  # a key object (or its session) that could not be written


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

    async def upload_spec(self, spec: JobSpec) -> str:
        key = self.spec_key(spec.job_id, spec.attempt)
        s3 = await self.clients.get("s3")
        try:
            await s3.put_object(
                Bucket=self.settings.bucket,
                Key=key,
                Body=spec.model_dump_json().encode(),
                ContentType="application/json",
            )
        except (ClientError, BotoCoreError, ResponseParserError) as exc:
            raise LaunchError(f"could not upload the spec to s3://{self.settings.bucket}/{key}: {exc}") from exc
        return f"s3://{self.settings.bucket}/{key}"

    async def write_key(self, job_id: str, attempt: int, instance_id: str) -> None:
        """Write the attempt's key (and a fresh storage session, with a storage role) where only ``instance_id``'s
        runner may read it; nothing without report keys. One of :data:`KEY_FAILURES` when it cannot."""
        role_id = self.settings.runner_role_id
        if self.report_keys is None or role_id is None:
            return
        storage = await self._storage_session(job_id, attempt) if self.renews_storage else None
        s3 = await self.clients.get("s3")
        await s3.put_object(
            Bucket=self.settings.bucket,
            Key=key_object(role_id, instance_id),
            Body=dump_attempt_key(job_id, attempt, self.report_keys.of(job_id, attempt), storage),
            ContentType="application/json",
            # the runner role's Deny refuses a key object whose tag does not name the session reading it
            Tagging=urlencode({READER_TAG: reader(role_id, instance_id)}),
        )

    async def _storage_session(self, job_id: str, attempt: int) -> StorageCredentials:
        """An STS session of the runner storage role limited to the job's prefix, for one hour (role chaining's cap),
        named after the job and attempt so CloudTrail says whose each request was."""
        role = self.settings.runner_storage_role_arn
        if role is None:
            raise ValueError("no aws.runner_storage_role_arn")
        policy = session_policy(self.settings.bucket, self.settings.prefix, job_id, partition_of(role))
        sts = await self.clients.get("sts")
        reply = await sts.assume_role(
            RoleArn=role,
            RoleSessionName=session_name(job_id, attempt),
            Policy=dump_session_policy(policy),
            DurationSeconds=SESSION_SECONDS,
        )
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
        try:
            name = key_object(role_id, instance_id)
            s3 = await self.clients.get("s3")
            await s3.delete_object(Bucket=self.settings.bucket, Key=name)
        except KEY_FAILURES as exc:
            log.warning("could not delete the key object of %s: %s", instance_id, exc)

    async def put_stop(self, job_id: str, attempt: int) -> None:
        """:class:`~handlers.spec.StopControl` in the attempt's control object, which its runner polls."""
        key = self.control_key(job_id, attempt)
        s3 = await self.clients.get("s3")
        try:
            await s3.put_object(
                Bucket=self.settings.bucket,
                Key=key,
                Body=dump_control(StopControl()),
                ContentType="application/json",
            )
        except (ClientError, BotoCoreError, ResponseParserError) as exc:
            raise AwsError(f"could not write the stop request s3://{self.settings.bucket}/{key}: {exc}") from exc

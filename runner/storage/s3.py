"""``s3://`` and ``oss://`` store over the S3 API (aiobotocore), built for fast parallel checkpoint transfers.

A spot notice gives us ~2 minutes, so transfers are the point: large files go as concurrent multipart
parts, downloads as concurrent ranged GETs, and one store-wide semaphore bounds the requests (and the
part buffers) in flight across every concurrent ``upload_file``/``download_file``.

Integrity without redundant hashing: botocore's automatic checksums and SigV4 payload hashing are off
(TLS guards the wire, and OSS rejects the aws-chunked trailer encoding botocore would otherwise use). For
``s3://`` we send the CRC32C of every part and small object instead (:mod:`runner.checksums`), computed in
the worker thread that reads it (awscrt drops the GIL): S3 verifies each part on arrival and keeps a composite
checksum of them, and the runner's manifest keeps the same per-part values, so no byte is
hashed twice. OSS's S3 API does not document ``x-amz-checksum-*``, so it gets none (the manifest still does).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import hashlib
import io
import logging
import os
import re
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Mapping
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar
from urllib.parse import urlparse

import aiohttp
from aiobotocore.session import get_session
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError
from botocore.parsers import ResponseParserError

from handlers.backoff import backoff
from runner.checksums import ALGORITHM, crc, encode
from runner.storage.aliyun_credentials import DEFAULT_METADATA_ENDPOINT, RamRoleCredentialProvider
from runner.storage.base import Buffer, ObjectInfo, ObjectMissing, StorageError, read_fully
from runner.storage.lanes import BorrowedCredentialProvider, BorrowedCredentials, SendLanes, default_lane_count
from runner.storage.slots import BufferSlots

log = logging.getLogger(__name__)

# No usable answer from the store: botocore's own errors, a reply it cannot parse (ResponseParserError is no
# BotoCoreError), and what aiohttp or the socket let through. The bot sorts botocore's errors the same way
# (bot/cloud/aws/errors.py); the runner never imports the bot, so the tuple is spelled here too.
NO_ANSWER = (BotoCoreError, ResponseParserError, aiohttp.ClientError, OSError)

MiB = 1024 * 1024
MIN_PART_SIZE = 5 * MiB  # S3's own floor for every part but the last
MAX_PARTS = 10_000
# Measured against moto on 2 cores (bench/upload_throughput.py): 8-24 MiB parts are all about equal; 64 MiB
# parts were ~30% slower (likely because buffers above glibc's 32 MiB mmap ceiling are page-faulted afresh).
# 16 MiB x 8 in flight is also the usual sweet spot for real S3, at ~128 MiB of part buffers.
DEFAULT_PART_SIZE = 16 * MiB
DEFAULT_MULTIPART_THRESHOLD = 16 * MiB
DEFAULT_CONCURRENCY = 8
WRITE_CHUNK = 8 * MiB  # downloads stream to disk in pieces this big, whatever the range size
DELETE_BATCH = 1000  # the DeleteObjects maximum
LIST_PAGE_SIZE = 1000  # the ListObjectsV2 maximum; tests shrink it to exercise paging
ADDRESSING_STYLES = ("auto", "virtual", "path")
RANGE_RETRIES = 4  # a download cut short (a reset, a truncated body) resumes from where it stopped this often
ABORT_SECONDS = 10.0  # how long a background abort of a given-up multipart upload may take
CLOSE_WAIT_SECONDS = 5.0  # how long close() lets background aborts finish

T = TypeVar("T")
_REGION = re.compile(r"^[a-z]{2}(-[a-z0-9]+)+-\d{1,2}$")  # us-east-1, cn-north-1, us-gov-west-1


class CredentialProvider(Protocol):
    """What botocore's credential resolver asks of a provider we put first (``insert_before("env", …)``)."""

    METHOD: str
    CANONICAL_NAME: str

    async def load(self) -> Any: ...


@dataclass(frozen=True, slots=True)
class ClientSettings:
    """How the S3 client connects, resolved once from the URI scheme and the environment.

    ``None`` fields are left to botocore's own resolution (``AWS_ENDPOINT_URL``, profiles, credential chain).
    """

    endpoint_url: str | None
    region: str | None
    addressing_style: str | None
    access_key_id: str | None = None
    secret_access_key: str | None = None
    session_token: str | None = None
    send_checksums: bool = True
    ram_role: str | None = None  # oss:// on ECS without a key pair: the instance RAM role's STS credentials
    metadata_endpoint: str = DEFAULT_METADATA_ENDPOINT
    max_attempts: int = 5  # per request, botocore's own retries included (AWS_MAX_ATTEMPTS, as botocore reads it)


def client_settings(scheme: str, env: Mapping[str, str]) -> ClientSettings:
    """``s3``: botocore defaults. ``oss``: Alibaba OSS's S3-compatible API, which wants virtual hosting; its
    credentials are ``ALIBABA_CLOUD_ACCESS_KEY_ID`` / ``_SECRET`` (/ ``ALIBABA_CLOUD_SECURITY_TOKEN``), else the
    instance RAM role named by ``ALIBABA_CLOUD_ECS_METADATA`` (:mod:`runner.storage.aliyun_credentials`)."""
    override = env.get("FINETUNE_S3_ADDRESSING") or None
    if override is not None and override not in ADDRESSING_STYLES:
        raise StorageError(f"FINETUNE_S3_ADDRESSING must be one of {ADDRESSING_STYLES}, not {override!r}")
    raw_attempts = env.get("AWS_MAX_ATTEMPTS") or "5"
    if not raw_attempts.isdigit() or int(raw_attempts) < 1:
        raise StorageError(f"AWS_MAX_ATTEMPTS must be a whole number of at least 1, not {raw_attempts!r}")
    attempts = int(raw_attempts)
    if scheme == "s3":
        return ClientSettings(None, storage_region(env), override, max_attempts=attempts)
    if scheme == "oss":
        endpoint = env.get("OSS_ENDPOINT") or env.get("AWS_ENDPOINT_URL")
        if not endpoint:
            raise StorageError(
                "oss:// needs an endpoint: set OSS_ENDPOINT (e.g. https://oss-cn-hangzhou-internal.aliyuncs.com)"
            )
        key_id = env.get("ALIBABA_CLOUD_ACCESS_KEY_ID") or None
        secret = env.get("ALIBABA_CLOUD_ACCESS_KEY_SECRET") or None
        if key_id is None or secret is None:  # half a key pair is no key pair: the role, else the normal chain
            key_id = secret = None
        return ClientSettings(
            endpoint_url=endpoint,
            region=env.get("OSS_REGION") or _oss_region(endpoint),
            addressing_style=override or "virtual",
            access_key_id=key_id,
            secret_access_key=secret,
            session_token=(env.get("ALIBABA_CLOUD_SECURITY_TOKEN") or None) if key_id else None,
            send_checksums=False,
            ram_role=None if key_id else (env.get("ALIBABA_CLOUD_ECS_METADATA") or None),
            metadata_endpoint=env.get("ALIBABA_CLOUD_METADATA_ENDPOINT") or DEFAULT_METADATA_ENDPOINT,
            max_attempts=attempts,
        )
    raise StorageError(f"unsupported scheme {scheme!r} for the S3 store")


def storage_region(env: Mapping[str, str]) -> str | None:
    """The region an ``s3://`` bucket is reached in: ``FINETUNE_STORAGE_REGION`` (the bucket's own, which the bot sets:
    a runner launched in another region still signs for, and talks to, the bucket's regional endpoint), else the
    instance's ``AWS_REGION`` / ``AWS_DEFAULT_REGION`` (botocore itself reads only the latter); None: botocore's
    profile, then us-east-1."""
    named = env.get("FINETUNE_STORAGE_REGION") or None
    if named is not None and not _REGION.fullmatch(named):
        raise StorageError(f"FINETUNE_STORAGE_REGION must be a region name such as us-east-1, not {named!r}")
    return named or env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or None


def _oss_region(endpoint: str) -> str:
    """``https://oss-cn-hangzhou-internal.aliyuncs.com`` → ``cn-hangzhou``; anything else → us-east-1."""
    host = urlparse(endpoint if "//" in endpoint else "//" + endpoint).hostname or ""
    label = host.split(".", 1)[0]
    if label.startswith("oss-") and host.endswith(".aliyuncs.com"):
        return label.removeprefix("oss-").removesuffix("-internal")
    return "us-east-1"


def _add_content_md5(params: dict[str, Any], **_: Any) -> None:
    """DeleteObjects needs Content-MD5 on OSS and most S3 clones; botocore >= 1.36 only sends a CRC32."""
    body = params.get("body") or b""
    digest = hashlib.md5(body, usedforsecurity=False).digest()
    params["headers"]["Content-MD5"] = base64.b64encode(digest).decode()


class S3Store:
    """Objects under ``s3://bucket/prefix/`` or ``oss://bucket/prefix/``; keys are relative to the prefix.

    ``part_size`` is the multipart part size, grown for huge files to stay within 10,000 parts; files up
    to ``multipart_threshold`` go in one request; ``concurrency`` bounds the part and range requests in
    flight for the whole store, so upload buffers stay near ``concurrency * part_size``. ``env`` replaces
    ``os.environ`` as the source of the client settings (the bot passes its configured OSS endpoint this way).
    ``credentials``: a botocore credential provider that comes before every other (AWS: the attempt's storage session
    from its key object, :mod:`runner.storage.attempt_credentials`); None: the usual chain.
    ``lanes``: how many threads send parts and whole objects and stream ranged downloads, each on a loop and client of
    its own (:mod:`runner.storage.lanes`; default: one per core this process may use, at most ``concurrency``); the
    rest (lists, small reads, multipart bookkeeping) goes through the store's own client on the caller's loop, whose
    credentials every lane signs with.
    """

    def __init__(
        self,
        base_uri: str,
        *,
        part_size: int = DEFAULT_PART_SIZE,
        multipart_threshold: int = DEFAULT_MULTIPART_THRESHOLD,
        concurrency: int = DEFAULT_CONCURRENCY,
        env: Mapping[str, str] | None = None,
        credentials: CredentialProvider | None = None,
        lanes: int | None = None,
    ) -> None:
        parsed = urlparse(base_uri)
        if parsed.scheme not in ("s3", "oss") or not parsed.netloc:
            raise StorageError(f"not an s3:// or oss:// bucket URI: {base_uri!r}")
        if part_size < MIN_PART_SIZE:
            raise ValueError(f"part_size must be at least {MIN_PART_SIZE} bytes (the S3 minimum)")
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if lanes is not None and lanes < 1:
            raise ValueError("lanes must be at least 1")
        self.bucket = parsed.netloc
        self.prefix = parsed.path.lstrip("/")
        if self.prefix and not self.prefix.endswith("/"):
            self.prefix += "/"
        self.base_uri = f"{parsed.scheme}://{self.bucket}/{self.prefix}"
        self.part_size = part_size
        self.multipart_threshold = max(multipart_threshold, 0)
        self.concurrency = concurrency
        self.settings = client_settings(parsed.scheme, os.environ if env is None else env)
        self.credentials = credentials
        self._slots = BufferSlots(concurrency, max(part_size, self.multipart_threshold))
        self._cleanup: set[asyncio.Task[None]] = set()
        self.last_error: tuple[float, str] | None = None  # (time.monotonic(), what) of the last failed request
        self._client_lock = asyncio.Lock()
        self._stack = AsyncExitStack()
        self._s3: Any = None
        self._session: Any = None
        self.lane_count = lanes if lanes is not None else default_lane_count(concurrency)
        self._lanes: SendLanes | None = None
        self._hooks: list[tuple[str, Callable[..., Any]]] = [
            ("before-call.s3.DeleteObjects", _add_content_md5),
            ("needs-retry.s3", self._note_failure),
        ]

    def client_config(self) -> Config:
        """Few retries' worth of patience, a pool as wide as our concurrency, no redundant hashing."""
        s3: dict[str, Any] = {"payload_signing_enabled": False}
        if self.settings.addressing_style is not None:
            s3["addressing_style"] = self.settings.addressing_style
        return Config(
            retries={"max_attempts": self.settings.max_attempts, "mode": "standard"},
            max_pool_connections=self.concurrency + 4,  # + HEAD/list/complete calls beside the parts
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
            s3=s3,
        )

    def uri(self, key: str) -> str:
        return self.base_uri + key

    def slot(self, priority: int = 0) -> AbstractAsyncContextManager[bytearray]:
        return self._slots.lend(priority)

    async def list_objects(self, prefix: str = "") -> list[ObjectInfo]:
        with self._errors("list", prefix):
            client = await self._client()
            found = []
            paginator = client.get_paginator("list_objects_v2")
            async for page in paginator.paginate(
                Bucket=self.bucket, Prefix=self.prefix + prefix, PaginationConfig={"PageSize": LIST_PAGE_SIZE}
            ):
                for item in page.get("Contents", []):
                    found.append(ObjectInfo(item["Key"][len(self.prefix) :], int(item["Size"])))
        return sorted(found, key=lambda info: info.key)

    async def list_dirs(self, prefix: str = "") -> list[str]:
        if prefix and not prefix.endswith("/"):
            prefix += "/"
        full = self.prefix + prefix
        with self._errors("list", prefix):
            client = await self._client()
            names = []
            paginator = client.get_paginator("list_objects_v2")
            async for page in paginator.paginate(
                Bucket=self.bucket, Prefix=full, Delimiter="/", PaginationConfig={"PageSize": LIST_PAGE_SIZE}
            ):
                for common in page.get("CommonPrefixes", []):
                    names.append(common["Prefix"][len(full) :].rstrip("/"))
        return sorted(names)

    async def upload_file(self, path: Path, key: str, priority: int = 0) -> None:
        with self._errors("upload to", key):
            size = (await asyncio.to_thread(path.stat)).st_size
            if size <= self.multipart_threshold:
                async with self._slots.lend(priority) as buffer:
                    data, crc = await asyncio.to_thread(_read_range, path, 0, size, buffer)
                    await self._send(
                        lambda lane: lane.put_object(
                            Bucket=self.bucket, Key=self.prefix + key, Body=_body(data), **self._crc_args(crc)
                        )
                    )
            else:
                await self._upload_multipart(path, size, key, priority)

    async def _upload_multipart(self, path: Path, size: int, key: str, priority: int) -> None:
        part_size = self._part_size_for(size)
        upload = await self.begin_upload(key, part_size)

        async def part(index: int, offset: int) -> None:
            async with self._slots.lend(priority) as buffer:
                data, crc = await asyncio.to_thread(_read_range, path, offset, min(part_size, size - offset), buffer)
                await upload.put_part(index, data, crc)

        try:
            await _all_or_nothing(part(index, offset) for index, offset in enumerate(range(0, size, part_size)))
            await upload.complete()
        except asyncio.CancelledError:
            upload.discard()
            raise
        except BaseException:
            # Parts of an unfinished upload are billed storage and invisible to list(): never leave them.
            await upload.abort()
            raise

    async def begin_upload(self, key: str, part_size: int) -> S3PartUpload:
        """A multipart upload of ``key``, declared CRC32C: every part then carries its CRC, which S3 checks on
        arrival, and the object gets a composite checksum of them (without an algorithm, moto re-copies and
        re-hashes the whole object on completion: measured ~20% slower uploads)."""
        if part_size < MIN_PART_SIZE:
            raise ValueError(f"part_size must be at least {MIN_PART_SIZE} bytes (the S3 minimum)")
        with self._errors("upload to", key):
            client = await self._client()
            algorithm = {"ChecksumAlgorithm": ALGORITHM}
            created = await client.create_multipart_upload(
                Bucket=self.bucket, Key=self.prefix + key, **(algorithm if self.settings.send_checksums else {})
            )
        return S3PartUpload(self, key, created["UploadId"], part_size)

    async def _abort(self, key: str, upload_id: str) -> None:
        try:
            client = await self._client()
            await asyncio.wait_for(
                client.abort_multipart_upload(Bucket=self.bucket, Key=self.prefix + key, UploadId=upload_id),
                ABORT_SECONDS,
            )
        except Exception as exc:
            log.warning("could not abort multipart upload of %s: %s", self.uri(key), exc)

    def _abort_later(self, key: str, upload_id: str) -> None:
        """Abort without making the caller wait: a cancelled upload must give its time back at once."""
        task = asyncio.get_running_loop().create_task(self._abort(key, upload_id))
        self._cleanup.add(task)
        task.add_done_callback(self._cleanup.discard)

    def _crc_args(self, crc: int) -> dict[str, str]:
        """The request fields that make S3 check a body against its CRC32C (none for OSS)."""
        if not self.settings.send_checksums:
            return {}
        return {"ChecksumAlgorithm": ALGORITHM, "ChecksumCRC32C": encode(crc)}

    def _part_size_for(self, size: int) -> int:
        """At least ``part_size``, but big enough for S3's 10,000-part limit (rounded up to whole MiB)."""
        needed = -(-size // MAX_PARTS)
        return max(self.part_size, -(-needed // MiB) * MiB)

    async def download_file(self, key: str, path: Path) -> None:
        with self._errors("download of", key):
            client = await self._client()
            try:
                head = await client.head_object(Bucket=self.bucket, Key=self.prefix + key)
            except ClientError as exc:
                if _is_missing(exc):
                    raise ObjectMissing(f"{self.uri(key)} does not exist") from exc
                raise
            size = int(head["ContentLength"])
            etag: str = head["ETag"]
            # Write a temp name in the same directory and rename: the final name is whole or absent.
            tmp = path.parent / f".tmp-{uuid.uuid4().hex}-{path.name}"
            await asyncio.to_thread(_create_sized, tmp, size)
            try:
                step = self._range_size(size)
                ranges = [(start, min(start + step, size)) for start in range(0, size, step)]
                ranged = len(ranges) > 1
                await _all_or_nothing(self._download_range(key, etag, tmp, start, end, ranged) for start, end in ranges)
                await asyncio.to_thread(os.replace, tmp, path)
            except BaseException:
                await asyncio.shield(asyncio.to_thread(tmp.unlink, missing_ok=True))
                raise

    def _range_size(self, size: int) -> int:
        """One GET for small objects, else about one range per slot (never below ``part_size``).

        Few big ranges beat many small ones: each GET has a fixed cost (moto even reads the whole
        object for every range), and since ranges stream to disk their size costs no memory.
        """
        if size <= self.multipart_threshold:
            return max(size, 1)
        per_slot = -(-size // self.concurrency)
        return max(self.part_size, -(-per_slot // MiB) * MiB)

    async def _download_range(self, key: str, etag: str, tmp: Path, start: int, end: int, ranged: bool) -> None:
        """GET bytes ``[start, end)`` into the file; If-Match makes a concurrent overwrite fail, not mix.

        A body cut short (a reset connection, a proxy that gives up) is a network fault, not a bad object:
        the rest of the range is asked for again, a few times, before the download fails.
        """
        offset = start
        failures = 0
        async with self._slots.hold():
            while True:
                resume = ranged or offset > start
                stream = functools.partial(
                    self._stream_range, key=key, etag=etag, tmp=tmp, start=offset, end=end, ranged=resume
                )
                offset, cut = await self._send(stream)  # on a lane: its loop reads the body, as it sends parts
                if cut is not None:
                    problem = f"was cut at byte {offset}: {cut}"
                elif offset == end:
                    return
                else:
                    problem = f"ended early at byte {offset}"
                failures += 1
                if failures > RANGE_RETRIES:
                    raise StorageError(f"{self.uri(key)}: range {start}-{end} {problem}") from cut
                log.warning("download of %s %s; resuming (%d of %d)", self.uri(key), problem, failures, RANGE_RETRIES)
                await asyncio.sleep(backoff(failures, base=0.2, cap=5.0, jitter=0))

    async def _stream_range(
        self, client: Any, key: str, etag: str, tmp: Path, start: int, end: int, ranged: bool
    ) -> tuple[int, Exception | None]:
        """Write what one GET of ``[start, end)`` delivers to disk; returns the offset reached and, when the
        connection failed mid-way, what cut it (what did arrive is kept)."""
        extra = {"Range": f"bytes={start}-{end - 1}"} if ranged else {}
        try:
            got = await client.get_object(Bucket=self.bucket, Key=self.prefix + key, IfMatch=etag, **extra)
        except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError) as exc:
            return start, exc
        offset = start
        body = got["Body"]
        async with body:  # entering yields the raw aiohttp response; read via the checked wrapper
            while offset < end:
                chunks: list[bytes] = []
                pending = 0
                failure: Exception | None = None
                while pending < WRITE_CHUNK:
                    try:
                        chunk: bytes = await body.read(WRITE_CHUNK - pending)
                    except _TRANSIENT_BODY_ERRORS as exc:
                        failure = exc
                        break
                    if not chunk:
                        break
                    chunks.append(chunk)
                    pending += len(chunk)
                if chunks:
                    await asyncio.to_thread(_write_chunks, tmp, offset, chunks)
                    offset += pending
                if failure is not None:
                    return offset, failure
                if not pending:
                    break
        return offset, None

    async def put_bytes(self, key: str, data: Buffer) -> None:
        checksum = self._crc_args(crc(data))
        with self._errors("upload to", key):
            await self._send(
                lambda lane: lane.put_object(Bucket=self.bucket, Key=self.prefix + key, Body=_body(data), **checksum)
            )

    async def get_bytes(self, key: str) -> bytes | None:
        with self._errors("read of", key):
            client = await self._client()
            try:
                got = await client.get_object(Bucket=self.bucket, Key=self.prefix + key)
            except ClientError as exc:
                if _is_missing(exc):
                    return None
                raise
            body = got["Body"]
            async with body:
                data: bytes = await body.read()
            return data

    async def delete(self, keys: list[str]) -> None:
        with self._errors("delete under", ""):
            client = await self._client()
            for start in range(0, len(keys), DELETE_BATCH):
                batch = keys[start : start + DELETE_BATCH]
                done = await client.delete_objects(
                    Bucket=self.bucket,
                    Delete={"Objects": [{"Key": self.prefix + key} for key in batch], "Quiet": True},
                )
                errors = done.get("Errors", [])
                if errors:
                    first = errors[0]
                    raise StorageError(
                        f"delete of {len(errors)} objects under {self.base_uri} failed, "
                        f"e.g. {first.get('Key')}: {first.get('Code')} {first.get('Message')}"
                    )

    async def close(self) -> None:
        if self._cleanup:
            await asyncio.wait(set(self._cleanup), timeout=CLOSE_WAIT_SECONDS)
        async with self._client_lock:
            lanes, self._lanes = self._lanes, None
            try:
                if lanes is not None:
                    await lanes.close()
            finally:
                await self._stack.aclose()
                self._stack = AsyncExitStack()
                self._s3 = None
                self._session = None

    async def _client(self) -> Any:
        """Created on first use, so building a store costs nothing and needs no running loop."""
        if self._s3 is None:
            async with self._client_lock:
                if self._s3 is None:
                    session = get_session()
                    provider: CredentialProvider | None = self.credentials
                    if provider is None and self.settings.ram_role:
                        provider = RamRoleCredentialProvider(self.settings.ram_role, self.settings.metadata_endpoint)
                    if provider is not None:
                        session.get_component("credential_provider").insert_before("env", provider)
                    self._s3 = await self._stack.enter_async_context(self._new_client(session))
                    self._session = session
        return self._s3

    @contextlib.asynccontextmanager
    async def _new_client(self, session: Any) -> AsyncIterator[Any]:
        settings = self.settings
        async with session.create_client(
            "s3",
            endpoint_url=settings.endpoint_url,
            region_name=settings.region,
            aws_access_key_id=settings.access_key_id,
            aws_secret_access_key=settings.secret_access_key,
            aws_session_token=settings.session_token,
            config=self.client_config(),
        ) as client:
            for event, handler in self._hooks:
                client.meta.events.register(event, handler)
            yield client

    def hook(self, event: str, handler: Callable[..., Any]) -> None:
        """Register a botocore event handler on every client of this store: its own, and each send lane's (there it
        runs in the lane's thread). Before the first send: the lanes' clients are made then."""
        if self._lanes is not None:
            raise RuntimeError("hook() after the store's send lanes started")
        self._hooks.append((event, handler))
        if self._s3 is not None:
            self._s3.meta.events.register(event, handler)

    async def _send(self, request: Callable[[Any], Awaitable[T]]) -> T:
        """``request(client)`` on one of the send lanes (started with the store's own client, at first use)."""
        if self._lanes is None:
            await self._client()
            async with self._client_lock:
                if self._lanes is None:
                    self._lanes = SendLanes(self.lane_count, await self._lane_client_factory())
        return await self._lanes.run(request)

    async def _lane_client_factory(self) -> Callable[[], AbstractAsyncContextManager[Any]]:
        """What each lane makes its client with, in its own thread: the store's settings, and the credentials the
        store's own client signs with, borrowed (an explicit key pair is simply the same key pair)."""
        owner = None if self.settings.access_key_id else await self._session.get_credentials()
        home = asyncio.get_running_loop()

        def make() -> AbstractAsyncContextManager[Any]:
            session = get_session()
            if owner is not None:
                borrowed = BorrowedCredentialProvider(BorrowedCredentials(owner, home))
                session.get_component("credential_provider").insert_before("env", borrowed)
            return self._new_client(session)

        return make

    def _note_failure(
        self, response: tuple[Any, Any] | None = None, caught_exception: BaseException | None = None, **_: Any
    ) -> None:
        """Remember what the store last answered when a request failed, even one botocore then retried: a call
        cancelled at a deadline can still say the store was answering 503 SlowDown all along."""
        if caught_exception is not None:
            self.last_error = (time.monotonic(), f"{type(caught_exception).__name__}: {caught_exception}")
        elif response is not None and getattr(response[0], "status_code", 200) in _TROUBLE_STATUS:
            code = (response[1] or {}).get("Error", {}).get("Code", "")
            self.last_error = (time.monotonic(), f"HTTP {response[0].status_code} {code}".strip())

    @contextlib.contextmanager
    def _errors(self, action: str, key: str) -> Iterator[None]:
        """SDK, HTTP and local I/O failures (after botocore's retries) become StorageError naming the URI (and the
        HTTP status the store answered: botocore's text may not carry it, e.g. "(SlowDown) … : Unknown")."""
        try:
            yield
        except ClientError as exc:
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            answered = f"HTTP {status}: " if status else ""
            raise StorageError(f"{action} {self.uri(key)} failed: {answered}{exc}") from exc
        except NO_ANSWER as exc:
            raise StorageError(f"{action} {self.uri(key)} failed: {exc}") from exc


class S3PartUpload:
    """One multipart upload; parts are numbered from 1 on the wire, from 0 here."""

    def __init__(self, store: S3Store, key: str, upload_id: str, part_size: int) -> None:
        self.store = store
        self.key = key
        self.upload_id = upload_id
        self.part_size = part_size
        self._parts: dict[int, dict[str, Any]] = {}
        self._finished = False

    async def put_part(self, index: int, data: Buffer, crc: int) -> None:
        store = self.store
        checksum = store._crc_args(crc)
        with store._errors("upload to", self.key):
            sent = await store._send(
                lambda lane: lane.upload_part(
                    Bucket=store.bucket,
                    Key=store.prefix + self.key,
                    UploadId=self.upload_id,
                    PartNumber=index + 1,
                    Body=_body(data),
                    **checksum,
                )
            )
        done = {"PartNumber": index + 1, "ETag": sent["ETag"]}
        if "ChecksumCRC32C" in checksum:
            done["ChecksumCRC32C"] = checksum["ChecksumCRC32C"]
        self._parts[index] = done

    async def complete(self) -> None:
        store = self.store
        parts = [self._parts[index] for index in sorted(self._parts)]
        with store._errors("upload to", self.key):
            client = await store._client()
            await client.complete_multipart_upload(
                Bucket=store.bucket,
                Key=store.prefix + self.key,
                UploadId=self.upload_id,
                MultipartUpload={"Parts": parts},
            )
        self._finished = True

    async def abort(self) -> None:
        if not self._finished:
            self._finished = True
            await self.store._abort(self.key, self.upload_id)

    def discard(self) -> None:
        if not self._finished:
            self._finished = True
            self.store._abort_later(self.key, self.upload_id)


async def _all_or_nothing(jobs: Iterable[Awaitable[T]]) -> list[T]:
    """Run concurrently, in order; the first failure cancels the rest and is raised as itself."""
    try:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(_awaited(job)) for job in jobs]
    except BaseExceptionGroup as failed:
        raise failed.exceptions[0] from None
    return [task.result() for task in tasks]


async def _awaited(job: Awaitable[T]) -> T:
    return await job


_TROUBLE_STATUS = {429, 500, 502, 503, 504}  # what a store under strain answers; a 404 is an answer
_TRANSIENT_BODY_ERRORS = (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError, BotoCoreError)


def _is_missing(exc: ClientError) -> bool:
    error = exc.response.get("Error", {})
    return error.get("Code") in ("NoSuchKey", "404", "NotFound")


# Each thread job opens its own descriptor: a cancelled task's thread keeps running, and must never touch
# a descriptor the event loop side has closed (and the kernel may have reused for another file).


def _read_range(path: Path, offset: int, size: int, buffer: bytearray) -> tuple[memoryview, int]:
    """One part of the file, read into ``buffer`` (a bigger one is made if it is too small), and its CRC32C; a
    short read means the file shrank, which must not upload."""
    view = memoryview(buffer if len(buffer) >= size else bytearray(size))[:size]
    with open(path, "rb", buffering=0) as file:
        got = read_fully(file, offset, view)
    if got != size:
        raise StorageError(f"{path} changed during upload: wanted {size} bytes at {offset}, got {got}")
    return view, crc(view)


class _Body(io.BytesIO):
    """A request body that aiohttp sends in 256 KiB slices straight out of the caller's buffer: no copy of the
    whole part (``bytes(buffer)``), no fresh allocation. botocore seeks it back to 0 to retry."""

    def __init__(self, view: memoryview) -> None:
        super().__init__()
        self._view = view
        self._position = 0

    def read(self, size: int | None = -1) -> memoryview:  # type: ignore[override]
        end = len(self._view) if size is None or size < 0 else min(self._position + size, len(self._view))
        piece = self._view[self._position : end]
        self._position = end
        return piece

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = 0) -> int:
        base = (0, self._position, len(self._view))[whence]
        self._position = max(0, min(base + offset, len(self._view)))
        return self._position

    def getbuffer(self) -> memoryview:
        return memoryview(self._view)  # a view of its own: aiohttp releases what it gets here


def _body(data: Buffer) -> bytes | _Body:
    """Small bodies as they are; large ones through :class:`_Body`."""
    if len(data) <= 256 * 1024:
        return bytes(data)
    return _Body(memoryview(data).cast("B"))


def _create_sized(path: Path, size: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.ftruncate(fd, size)
    finally:
        os.close(fd)


def _write_chunks(path: Path, offset: int, chunks: list[bytes]) -> None:
    fd = os.open(path, os.O_WRONLY)  # no O_CREAT: a straggler after a failed download must not resurrect it
    try:
        for chunk in chunks:
            view = memoryview(chunk)
            while view:
                written = os.pwrite(fd, view, offset)
                view = view[written:]
                offset += written
    finally:
        os.close(fd)

"""Is this SNS message really from SNS? Its RSA signature, checked with the certificate SNS publishes.

The string to sign is fixed by AWS: ``<Key>\\n<value>\\n`` for a fixed list of keys in a fixed order. A
``Notification`` signs Message, MessageId, Subject (only when present), Timestamp, TopicArn, Type; a
``SubscriptionConfirmation`` or ``UnsubscribeConfirmation`` signs Message, MessageId, SubscribeURL, Timestamp,
Token, TopicArn, Type. ``SignatureVersion`` 1 is SHA1withRSA, 2 is SHA256withRSA (PKCS #1 v1.5), base64-encoded.

Anyone can put the URL of their own certificate in a forged message, so the certificate is fetched only from the
one place SNS keeps its certificates: ``https://sns.<region>.amazonaws.com/SimpleNotificationService-<32 hex>.pem``
(``.com.cn`` in China), the region being the message's topic's (the host is pinned by the TopicArn), with no
port, query or fragment, and never through a redirect: that check is what ties the key to AWS.

Version 1 (SHA1) is refused unless the verifier is told to accept it (``allow_sha1``,
``FINETUNE_SNS_ALLOW_SHA1=1``): the stacks create their topics with ``SignatureVersion: 2``, so a version 1
message is either from a topic someone else made or a downgrade, and each refusal is counted.

Certificates are cached by that validated URL: SNS rotates them rarely, and a fetch per message would make the
endpoint a request amplifier. A stranger who knows an allowed topic can still name a new ``<hex>`` in every
message, so fetches are limited too: one at a time (a message waiting for it finds the certificate cached when its
turn comes) and at most ``max_fetches`` per ``fetch_window`` seconds; past that, an :class:`~bot.errors.InputRefused`
of status 503 (the endpoint answers it, so SNS delivers a genuine message again later). A message unsigned, forged,
or signed with a certificate that cannot be trusted is one of status 403, its reason saying which. The scheme, the
host pattern and the fetcher are injectable so tests can serve their own certificate; production keeps the strict
defaults.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import re
import time
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Collection, Mapping
from datetime import UTC, datetime
from typing import Any, TypeGuard
from urllib.parse import urlsplit

import aiohttp
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from bot.errors import InputRefused

# The region group pins a certificate's host to the topic's region (a pattern without one, the tests', pins none).
SNS_HOST_PATTERN = re.compile(r"^sns\.(?P<region>[a-z0-9-]+)\.amazonaws\.com(?P<china>\.cn)?$")
CERT_PATH = re.compile(r"^/SimpleNotificationService-[0-9a-f]{32}\.pem$")  # as SNS names every certificate
MAX_FETCHES = 10  # certificate fetches per window (SNS uses one certificate per region for months)
FETCH_WINDOW_SECONDS = 600.0
SECURE_SCHEMES: tuple[str, ...] = ("https",)
NOTIFICATION_KEYS: tuple[str, ...] = ("Message", "MessageId", "Subject", "Timestamp", "TopicArn", "Type")
CONFIRMATION_KEYS: tuple[str, ...] = ("Message", "MessageId", "SubscribeURL", "Timestamp", "Token", "TopicArn", "Type")
MAX_CERT_BYTES = 64 * 1024
FETCH_TIMEOUT_SECONDS = 10.0
SHA1_REFUSED_METRIC = "finetune_sns_sha1_refused_total"

UrlFetcher = Callable[[str], Awaitable[bytes]]


def _forged(reason: str) -> InputRefused:
    """The message is unsigned, forged, or its certificate cannot be trusted (403); ``reason`` says which."""
    return InputRefused(reason, status=403)


def string_to_sign(message: Mapping[str, Any]) -> bytes:
    """The canonical bytes SNS signed for ``message`` (a 403 :class:`~bot.errors.InputRefused` if a signed field is
    missing)."""
    kind = message.get("Type")
    if kind == "Notification":
        keys = NOTIFICATION_KEYS
    elif kind in ("SubscriptionConfirmation", "UnsubscribeConfirmation"):
        keys = CONFIRMATION_KEYS
    else:
        raise _forged(f"no signing rule for message type {kind!r}")
    parts: list[str] = []
    for key in keys:
        value = message.get(key)
        if value is None and key == "Subject":
            continue  # optional: signed only when present
        if not isinstance(value, str):
            raise _forged(f"signed field {key} is missing or not a string")
        parts.append(f"{key}\n{value}\n")
    return "".join(parts).encode()


def is_allowed_url(url: object, host_pattern: re.Pattern[str], schemes: Collection[str]) -> TypeGuard[str]:
    """True when ``url`` uses an allowed scheme, names an allowed host, and carries no credentials."""
    if not isinstance(url, str):
        return False
    try:
        parts = urlsplit(url)
        _ = parts.port  # raises ValueError on a malformed port
    except ValueError:
        return False
    host = parts.hostname or ""
    return (
        parts.scheme in schemes
        and parts.username is None
        and parts.password is None
        and host_pattern.fullmatch(host) is not None
    )


async def fetch_url(url: str, max_bytes: int = MAX_CERT_BYTES) -> bytes:
    """GET ``url`` (no redirects: one could leave the SNS host) and return at most ``max_bytes`` of a 200 body."""
    timeout = aiohttp.ClientTimeout(total=FETCH_TIMEOUT_SECONDS)
    async with (
        aiohttp.ClientSession(timeout=timeout) as session,
        session.get(url, allow_redirects=False) as response,
    ):
        if response.status != 200:
            raise InputRefused(f"GET {url} answered {response.status}")
        body = await response.content.read(max_bytes + 1)
        if len(body) > max_bytes:
            raise InputRefused(f"GET {url} returned more than {max_bytes} bytes")
        return body


class SnsVerifier:
    """Verifies SNS message signatures; holds the certificate cache. One per process is enough."""

    def __init__(
        self,
        fetch: UrlFetcher = fetch_url,
        *,
        host_pattern: re.Pattern[str] = SNS_HOST_PATTERN,
        schemes: Collection[str] = SECURE_SCHEMES,
        cache_size: int = 32,
        clock: Callable[[], float] = time.time,
        allow_sha1: bool = False,
        max_fetches: int = MAX_FETCHES,
        fetch_window: float = FETCH_WINDOW_SECONDS,
    ) -> None:
        self._fetch = fetch
        self.allow_sha1 = allow_sha1
        self.sha1_refused = 0  # version 1 messages refused (allow_sha1 off)
        self.host_pattern = host_pattern
        self.schemes = tuple(schemes)
        self._cache_size = cache_size
        self._clock = clock
        self._certs: OrderedDict[str, x509.Certificate] = OrderedDict()
        self.fetches = 0
        self.max_fetches = max_fetches
        self.fetch_window = fetch_window
        self._fetched_at: deque[float] = deque()  # when each fetch of the current window started
        self._fetching = asyncio.Lock()  # one fetch at a time

    def allows_url(self, url: object) -> TypeGuard[str]:
        """Whether ``url`` is on SNS (the same rule guards SigningCertURL and SubscribeURL)."""
        return is_allowed_url(url, self.host_pattern, self.schemes)

    async def verify(self, message: Mapping[str, Any]) -> None:
        """Return if ``message`` is signed by SNS; raise a 403 InputRefused saying why not otherwise
        (503: its certificate is not fetched now)."""
        version = message.get("SignatureVersion")
        if version == "1":
            if not self.allow_sha1:
                self.sha1_refused += 1
                raise _forged(
                    "SignatureVersion 1 (SHA1) is refused: create the topic with SignatureVersion 2, "
                    "or set FINETUNE_SNS_ALLOW_SHA1=1"
                )
            algorithm: hashes.HashAlgorithm = hashes.SHA1()  # SNS SignatureVersion 1 is SHA1withRSA
        elif version == "2":
            algorithm = hashes.SHA256()
        else:
            raise _forged(f"unsupported or missing SignatureVersion {version!r}")
        signature_text = message.get("Signature")
        if not isinstance(signature_text, str) or not signature_text:
            raise _forged("no Signature")
        try:
            signature = base64.b64decode(signature_text, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise _forged("Signature is not base64") from exc
        signed = string_to_sign(message)
        key = (await self._certificate(self.certificate_url(message))).public_key()
        if not isinstance(key, rsa.RSAPublicKey):
            raise _forged("the signing certificate does not hold an RSA key")
        try:
            key.verify(signature, signed, padding.PKCS1v15(), algorithm)
        except InvalidSignature as exc:
            raise _forged("the signature does not match the message") from exc

    def certificate_url(self, message: Mapping[str, Any]) -> str:
        """The message's SigningCertURL in its one accepted form (see the module docstring), rebuilt from its
        checked parts: the URL fetched and the certificate cache's key; else a 403 InputRefused saying why."""
        url = message.get("SigningCertURL")
        if not self.allows_url(url):
            raise _forged(f"SigningCertURL {url!r} is not an SNS certificate URL")
        parts = urlsplit(url)
        host = parts.hostname or ""
        if parts.query or parts.fragment or CERT_PATH.fullmatch(parts.path) is None:
            raise _forged(f"SigningCertURL {url!r} is not SNS's SimpleNotificationService-<hex>.pem")
        if parts.port is not None and parts.scheme == "https":
            raise _forged(f"SigningCertURL {url!r} names a port")
        pinned = self.host_pattern.fullmatch(host)
        if pinned is not None and "region" in pinned.groupdict():
            partition, region = _topic_region(message.get("TopicArn"))
            if pinned["region"] != region or bool(pinned["china"]) != (partition == "aws-cn"):
                raise _forged(f"SigningCertURL {url!r} is not the SNS host of the topic's region")
        port = f":{parts.port}" if parts.port is not None else ""
        return f"{parts.scheme}://{host}{port}{parts.path}"

    async def _certificate(self, url: str) -> x509.Certificate:
        cert = self._certs.get(url)
        if cert is None:
            async with self._fetching:
                cert = self._certs.get(url)  # fetched while this message waited its turn
                if cert is None:
                    cert = await self._fetch_certificate(url)
        else:
            self._certs.move_to_end(url)
        now = datetime.fromtimestamp(self._clock(), UTC)
        if not cert.not_valid_before_utc <= now <= cert.not_valid_after_utc:
            raise _forged(f"the signing certificate {url} is not valid now")
        return cert

    async def _fetch_certificate(self, url: str) -> x509.Certificate:
        """Fetch, parse and cache ``url``'s certificate, within the fetch budget (held under ``_fetching``)."""
        now = self._clock()
        while self._fetched_at and self._fetched_at[0] <= now - self.fetch_window:
            self._fetched_at.popleft()
        if len(self._fetched_at) >= self.max_fetches:
            raise InputRefused(
                f"{self.max_fetches} signing certificates fetched in the last {self.fetch_window:.0f} s: "
                f"not fetching {url} now",
                status=503,  # the sender should try again later
            )
        self._fetched_at.append(now)
        self.fetches += 1
        try:
            pem = await self._fetch(url)
        except Exception as exc:
            raise _forged(f"cannot fetch the signing certificate {url}: {exc}") from exc
        try:
            cert = x509.load_pem_x509_certificate(pem)
        except ValueError as exc:
            raise _forged(f"{url} is not a PEM certificate") from exc
        self._certs[url] = cert
        while len(self._certs) > self._cache_size:
            self._certs.popitem(last=False)
        return cert


def _topic_region(topic_arn: object) -> tuple[str, str]:
    """The partition and region of ``arn:<partition>:sns:<region>:<account>:<name>`` (empty when not one)."""
    parts = topic_arn.split(":") if isinstance(topic_arn, str) else []
    if len(parts) != 6 or parts[0] != "arn" or parts[2] != "sns":
        return "", ""
    return parts[1], parts[3]

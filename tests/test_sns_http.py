"""The SNS HTTPS endpoint: messages signed as SNS signs them are accepted; forged, foreign and stale ones are not."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import boto3
import pytest
from aiohttp import web

from bot.bus import EVENT_FIELD, EventBus
from bot.errors import InputRefused
from bot.redis_server import connect
from bot.report_gate import ReportGate
from bot.sources.aws_intake import AwsIntake
from bot.sources.sns_http import SNS_PATH, sns_routes
from bot.sources.sns_signature import (
    SnsVerifier,
    UrlFetcher,
    fetch_url,
    is_allowed_url,
    string_to_sign,
)
from fakes.restartable_valkey import RestartableValkey
from handlers.aws_events import event_message_id
from handlers.messages import CloudEvent, ReportReceived, parse_message
from handlers.report_keys import ReportKeys
from handlers.signing import sign
from tests.sns_payloads import progress_report, rebalance, spot_warning
from tests.sns_queues import RecordingBus
from tests.sns_signing import SnsSigner, confirmation, notification

TOPIC = "arn:aws:sns:us-east-1:123456789012:finetune-events"
OTHER_TOPIC = "arn:aws:sns:us-east-1:999999999999:someone-else"
LOCAL_HOST = re.compile(r"127\.0\.0\.1")
CERT_NAME = "SimpleNotificationService-0123456789abcdef0123456789abcdef.pem"  # as SNS names them: 32 hex digits
SNS_CERT_URL = f"https://sns.us-east-1.amazonaws.com/{CERT_NAME}"
EVENT_ID = "5a1e0000-0000-4000-8000-00000000abcd"

Serve = Callable[[web.Application], Awaitable[str]]


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    """Start an aiohttp app on a free loopback port; returns its base URL. Everything is cleaned up after."""
    runners: list[web.AppRunner] = []

    async def start(app: web.Application) -> str:
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        runners.append(runner)
        return f"http://127.0.0.1:{runner.addresses[0][1]}"

    yield start
    for runner in runners:
        await runner.cleanup()


class CertHost:
    """Serves the test signer's certificate over HTTP and counts the fetches."""

    def __init__(self, signer: SnsSigner) -> None:
        self.signer = signer
        self.hits = 0
        self.url = ""

    async def handle(self, request: web.Request) -> web.Response:
        self.hits += 1
        return web.Response(body=self.signer.pem, content_type="application/x-x509-ca-cert")


@pytest.fixture(scope="session")
def signer() -> SnsSigner:
    return SnsSigner()


@pytest.fixture
async def cert_host(serve: Serve, signer: SnsSigner) -> CertHost:
    host = CertHost(signer)
    app = web.Application()
    app.router.add_get(f"/{CERT_NAME}", host.handle)
    host.url = await serve(app) + f"/{CERT_NAME}"
    return host


class Confirmations:
    def __init__(self) -> None:
        self.urls: list[str] = []

    async def __call__(self, url: str) -> bytes:
        self.urls.append(url)
        return b"<ConfirmSubscriptionResponse/>"


class Endpoint:
    """The bot's SNS route on a real server, with what it published and confirmed."""

    def __init__(self, url: str, bus: RecordingBus, verifier: SnsVerifier, confirmed: Confirmations) -> None:
        self.url = url
        self.bus = bus
        self.verifier = verifier
        self.confirmed = confirmed

    async def post(self, message: dict[str, Any] | str, headers: dict[str, str] | None = None) -> tuple[int, Any]:
        body = message if isinstance(message, str) else json.dumps(message)
        sent = {"Content-Type": "text/plain; charset=UTF-8", **(headers or {})}
        if isinstance(message, dict) and "x-amz-sns-message-type" not in sent:
            sent["x-amz-sns-message-type"] = str(message.get("Type"))
        async with aiohttp.ClientSession() as session, session.post(self.url, data=body, headers=sent) as response:
            return response.status, await response.json()


async def start_endpoint(serve: Serve, verifier: SnsVerifier, bus: RecordingBus | None = None) -> Endpoint:
    bus = bus or RecordingBus()
    confirmed = Confirmations()
    app = web.Application()
    app.add_routes(sns_routes(bus.publish, [TOPIC], verifier, confirm=confirmed))
    return Endpoint(await serve(app) + SNS_PATH, bus, verifier, confirmed)


@pytest.fixture
async def local(serve: Serve) -> Endpoint:
    """Certificates from the loopback host over plain HTTP: the test relaxation, fetched with the real fetcher."""
    return await start_endpoint(serve, SnsVerifier(host_pattern=LOCAL_HOST, schemes=("http",)))


@pytest.fixture
async def sha1_allowed(serve: Serve) -> Endpoint:
    """As ``local``, told to accept SignatureVersion 1 (FINETUNE_SNS_ALLOW_SHA1=1)."""
    return await start_endpoint(serve, SnsVerifier(host_pattern=LOCAL_HOST, schemes=("http",), allow_sha1=True))


@pytest.fixture
async def strict(serve: Serve, signer: SnsSigner) -> Endpoint:
    """Production rules (https, SNS hosts only); the injected fetcher answers for SNS with the test certificate."""
    fetched: list[str] = []

    async def fetch(url: str) -> bytes:
        fetched.append(url)
        return signer.pem

    return await start_endpoint(serve, SnsVerifier(fetch))


@pytest.mark.parametrize("version", ["1", "2"])
async def test_a_signed_notification_is_published(serve: Serve, cert_host: CertHost, version: str) -> None:
    """Version 2, and version 1 where allowed (FINETUNE_SNS_ALLOW_SHA1=1)."""
    verifier = SnsVerifier(host_pattern=LOCAL_HOST, schemes=("http",), allow_sha1=version == "1")
    local = await start_endpoint(serve, verifier)
    signed = cert_host.signer.sign(
        notification(TOPIC, spot_warning("i-0abc", event_id=EVENT_ID)), cert_host.url, version
    )
    status, answer = await local.post(signed)
    assert status == 200
    [event] = local.bus.events
    message = parse_message(event)
    assert isinstance(message, CloudEvent)
    expected = ("spot-interruption", "i-0abc", event_message_id(EVENT_ID))
    assert (message.kind, message.instance_id, message.id) == expected
    assert answer == {"accepted": [message.id]}


async def test_the_subject_is_signed_when_present_and_the_certificate_is_fetched_once(
    local: Endpoint, cert_host: CertHost
) -> None:
    report, line = progress_report()
    for message in (notification(TOPIC, line, subject="progress"), notification(TOPIC, rebalance("i-0abc"))):
        status, _ = await local.post(cert_host.signer.sign(message, cert_host.url))
        assert status == 200
    first = parse_message(local.bus.events[0])
    assert isinstance(first, ReportReceived) and first.id == f"report:{report.job_id}:{report.attempt}:{report.id}"
    assert cert_host.hits == local.verifier.fetches == 1


async def test_production_rules_accept_a_certificate_on_an_sns_host(strict: Endpoint, signer: SnsSigner) -> None:
    status, _ = await strict.post(signer.sign(notification(TOPIC, rebalance("i-0abc")), SNS_CERT_URL, "2"))
    assert status == 200
    assert len(strict.bus.events) == 1


async def test_sha1_signatures_are_refused_and_counted_unless_allowed(
    local: Endpoint, sha1_allowed: Endpoint, cert_host: CertHost
) -> None:
    """A genuine version 1 signature: 403 by default (counted), accepted only where FINETUNE_SNS_ALLOW_SHA1 says."""
    signed = cert_host.signer.sign(notification(TOPIC, rebalance("i-0abc")), cert_host.url, "1")
    status, answer = await local.post(signed)
    assert status == 403
    assert "SignatureVersion 1 (SHA1) is refused" in answer["error"]
    assert local.bus.events == []
    assert local.verifier.sha1_refused == 1
    assert (await sha1_allowed.post(signed))[0] == 200
    assert len(sha1_allowed.bus.events) == 1
    assert sha1_allowed.verifier.sha1_refused == 0


def tampered(message: dict[str, Any]) -> dict[str, Any]:
    return {**message, "Message": rebalance("i-0evil")}


def unsigned(message: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in message.items() if key not in ("Signature", "SignatureVersion")}


def garbled(message: dict[str, Any]) -> dict[str, Any]:
    return {**message, "Signature": "not base64!"}


def unknown_version(message: dict[str, Any]) -> dict[str, Any]:
    return {**message, "SignatureVersion": "3"}


@pytest.mark.parametrize("forge", [tampered, unsigned, garbled, unknown_version])
async def test_forged_messages_are_refused(
    local: Endpoint, cert_host: CertHost, forge: Callable[[dict[str, Any]], dict[str, Any]]
) -> None:
    signed = cert_host.signer.sign(notification(TOPIC, rebalance("i-0abc")), cert_host.url)
    status, answer = await local.post(forge(signed))
    assert status == 403
    assert "signature refused" in answer["error"]
    assert local.bus.events == []


async def test_a_key_that_is_not_the_certificates_is_refused(local: Endpoint, cert_host: CertHost) -> None:
    impostor = SnsSigner()  # signs with its own key but points at the genuine certificate
    status, answer = await local.post(impostor.sign(notification(TOPIC, rebalance("i-0abc")), cert_host.url))
    assert (status, answer["error"]) == (403, "signature refused: the signature does not match the message")
    assert local.bus.events == []


async def test_a_certificate_on_another_host_is_never_fetched(strict: Endpoint, cert_host: CertHost) -> None:
    # Correctly signed, certificate served, but from a host that is not SNS (the forger's own certificate).
    status, answer = await strict.post(cert_host.signer.sign(notification(TOPIC, rebalance("i-0abc")), cert_host.url))
    assert status == 403
    assert "is not an SNS certificate URL" in answer["error"]
    assert (cert_host.hits, strict.verifier.fetches) == (0, 0)
    assert strict.bus.events == []


async def test_a_topic_outside_the_allowlist_is_refused_before_any_fetch(local: Endpoint, cert_host: CertHost) -> None:
    status, answer = await local.post(
        cert_host.signer.sign(notification(OTHER_TOPIC, rebalance("i-0abc")), cert_host.url)
    )
    assert status == 403
    assert "is not allowed here" in answer["error"]
    assert cert_host.hits == 0
    assert local.bus.events == []


@pytest.mark.parametrize(
    ("age", "reason"), [(timedelta(hours=2), "older than 1:00:00"), (timedelta(minutes=-30), "in the future")]
)
async def test_stale_or_future_messages_are_refused(
    local: Endpoint, cert_host: CertHost, age: timedelta, reason: str
) -> None:
    message = notification(TOPIC, rebalance("i-0abc"), at=datetime.now(UTC) - age)
    status, answer = await local.post(cert_host.signer.sign(message, cert_host.url))
    assert status == 403
    assert reason in answer["error"]
    assert local.bus.events == []


async def test_a_subscription_is_confirmed_once_through_its_subscribe_url(local: Endpoint, cert_host: CertHost) -> None:
    subscribe_url = "http://127.0.0.1/?Action=ConfirmSubscription&TopicArn=x&Token=y"
    status, _ = await local.post(cert_host.signer.sign(confirmation(TOPIC, subscribe_url), cert_host.url, "2"))
    assert status == 200
    assert local.confirmed.urls == [subscribe_url]
    assert local.bus.events == []


async def test_confirmations_are_refused_for_other_topics_and_other_hosts(local: Endpoint, cert_host: CertHost) -> None:
    sign = cert_host.signer.sign
    foreign_topic = sign(confirmation(OTHER_TOPIC, "http://127.0.0.1/?Action=ConfirmSubscription"), cert_host.url)
    foreign_host = sign(confirmation(TOPIC, "http://attacker.example/?Action=ConfirmSubscription"), cert_host.url)
    assert (await local.post(foreign_topic))[0] == 403
    assert (await local.post(foreign_host))[0] == 403
    assert local.confirmed.urls == []


async def test_an_unsubscribe_confirmation_changes_nothing(local: Endpoint, cert_host: CertHost) -> None:
    message = confirmation(TOPIC, "http://127.0.0.1/?Action=ConfirmSubscription", kind="UnsubscribeConfirmation")
    status, _ = await local.post(cert_host.signer.sign(message, cert_host.url))
    assert status == 200
    assert (local.confirmed.urls, local.bus.events) == ([], [])


async def test_an_unrecognised_notification_is_a_client_error(local: Endpoint, cert_host: CertHost) -> None:
    status, answer = await local.post(cert_host.signer.sign(notification(TOPIC, '{"hello": 1}'), cert_host.url))
    assert status == 400  # SNS does not retry a 4xx: retrying cannot fix it
    assert "neither an EventBridge event nor a runner report" in answer["reason"]
    assert local.bus.events == []


async def test_a_bus_outage_asks_sns_to_retry(serve: Serve, cert_host: CertHost) -> None:
    bus = RecordingBus()
    bus.fail_next = 1
    endpoint = await start_endpoint(serve, SnsVerifier(host_pattern=LOCAL_HOST, schemes=("http",)), bus)
    signed = cert_host.signer.sign(notification(TOPIC, rebalance("i-0abc")), cert_host.url)
    assert (await endpoint.post(signed))[0] == 503
    assert (await endpoint.post(signed))[0] == 200  # SNS's retry
    assert len(bus.events) == 1


async def test_a_stopped_redis_asks_sns_to_retry_and_the_retry_lands(
    serve: Serve, cert_host: CertHost, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    valkey = RestartableValkey(tmp_path / "redis")
    await valkey.start()
    client = connect(valkey.url)
    try:
        bus = EventBus(client, stream="sns-outage:events")
        app = web.Application()
        app.add_routes(sns_routes(bus.publish, [TOPIC], SnsVerifier(host_pattern=LOCAL_HOST, schemes=("http",))))
        endpoint = Endpoint(await serve(app) + SNS_PATH, RecordingBus(), SnsVerifier(), Confirmations())  # for post()
        signed = cert_host.signer.sign(notification(TOPIC, rebalance("i-0abc")), cert_host.url)
        await valkey.stop()
        assert await endpoint.post(signed) == (503, {"error": "bus unavailable, retry"})
        assert [r for r in caplog.records if r.name.startswith("bot.sources") and r.exc_info is not None] == []
        await valkey.start()
        assert (await endpoint.post(signed))[0] == 200  # SNS's retry
        entries = await client.xrange("sns-outage:events")
        assert [json.loads(fields[EVENT_FIELD])["instance_id"] for _id, fields in entries] == ["i-0abc"]
    finally:
        await client.aclose()
        await valkey.stop()


async def test_malformed_bodies_are_bad_requests(local: Endpoint, cert_host: CertHost) -> None:
    signed = cert_host.signer.sign(notification(TOPIC, rebalance("i-0abc")), cert_host.url)
    assert (await local.post("not json"))[0] == 400
    assert (await local.post({"Type": "Something", "TopicArn": TOPIC}))[0] == 400
    assert (await local.post(signed, {"x-amz-sns-message-type": "SubscriptionConfirmation"}))[0] == 400
    assert local.bus.events == []


class CountingFetcher:
    """Answers for SNS with the test certificate, as slowly as the test says; counts fetches and overlaps."""

    def __init__(self, signer: SnsSigner) -> None:
        self.signer = signer
        self.urls: list[str] = []
        self.running = 0
        self.most_at_once = 0
        self.release = asyncio.Event()
        self.release.set()
        self.started = asyncio.Event()  # a fetch is under way

    async def __call__(self, url: str) -> bytes:
        self.urls.append(url)
        self.running += 1
        self.most_at_once = max(self.most_at_once, self.running)
        self.started.set()
        try:
            await self.release.wait()
        finally:
            self.running -= 1
        return self.signer.pem


def cert_url(hex_digits: str, host: str = "sns.us-east-1.amazonaws.com") -> str:
    return f"https://{host}/SimpleNotificationService-{hex_digits}.pem"


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("https://sns.us-east-1.amazonaws.com/cert.pem", "SimpleNotificationService-<hex>.pem"),
        (cert_url("0123456789ABCDEF0123456789ABCDEF"), "SimpleNotificationService-<hex>.pem"),
        (cert_url("0123456789abcdef"), "SimpleNotificationService-<hex>.pem"),
        (cert_url("0123456789abcdef0123456789abcdef") + "?v=1", "SimpleNotificationService-<hex>.pem"),
        (cert_url("0123456789abcdef0123456789abcdef") + "#x", "SimpleNotificationService-<hex>.pem"),
        (f"https://sns.us-east-1.amazonaws.com/x/{CERT_NAME}", "SimpleNotificationService-<hex>.pem"),
        (f"https://sns.us-east-1.amazonaws.com:8443/{CERT_NAME}", "names a port"),
        (cert_url("0123456789abcdef0123456789abcdef", "sns.eu-west-1.amazonaws.com"), "the topic's region"),
        (cert_url("0123456789abcdef0123456789abcdef", "sns.us-east-1.amazonaws.com.cn"), "the topic's region"),
        (f"http://sns.us-east-1.amazonaws.com/{CERT_NAME}", "is not an SNS certificate URL"),
    ],
)
async def test_a_certificate_anywhere_but_snss_path_on_the_topics_region_host_is_never_fetched(
    serve: Serve, signer: SnsSigner, url: str, why: str
) -> None:
    fetcher = CountingFetcher(signer)
    endpoint = await start_endpoint(serve, SnsVerifier(fetcher))
    status, answer = await endpoint.post(signer.sign(notification(TOPIC, rebalance("i-0abc")), url))
    assert status == 403 and why in answer["error"]
    assert fetcher.urls == [] and endpoint.bus.events == []


def test_the_certificate_host_is_pinned_to_the_topics_region_and_partition() -> None:
    verifier = SnsVerifier()
    china_topic = "arn:aws-cn:sns:cn-north-1:123456789012:finetune-events"
    china_url = cert_url("0123456789abcdef0123456789abcdef", "sns.cn-north-1.amazonaws.com.cn")
    message = {"TopicArn": china_topic, "SigningCertURL": china_url}
    assert verifier.certificate_url(message) == china_url
    with pytest.raises(InputRefused, match="the topic's region") as forged:
        verifier.certificate_url({**message, "TopicArn": TOPIC})
    assert forged.value.status == 403
    with pytest.raises(InputRefused, match="the topic's region") as forged:
        verifier.certificate_url({**message, "TopicArn": "not-an-arn"})
    assert forged.value.status == 403


async def test_the_cache_is_keyed_by_the_checked_url_and_a_flood_of_new_names_fetches_within_the_budget(
    serve: Serve, signer: SnsSigner
) -> None:
    now = [datetime.now(UTC).timestamp()]  # the verifier's clock, which the test moves past the fetch window
    fetcher = CountingFetcher(signer)
    verifier = SnsVerifier(fetcher, clock=lambda: now[0], max_fetches=3, fetch_window=600)
    endpoint = await start_endpoint(serve, verifier)

    def signed(url: str) -> dict[str, Any]:
        return signer.sign(notification(TOPIC, rebalance("i-0abc")), url)

    # The same certificate however its host is spelled: one fetch, of the URL as checked.
    assert (await endpoint.post(signed(SNS_CERT_URL)))[0] == 200
    assert (await endpoint.post(signed(SNS_CERT_URL.replace("sns.us-east-1", "SNS.US-EAST-1"))))[0] == 200
    assert fetcher.urls == [SNS_CERT_URL]

    # Twenty messages at once, each naming a certificate of its own: fetched one at a time, and only while the
    # budget lasts (2 more in this window); the others are told to come back (503: SNS delivers again later).
    fetcher.release.clear()
    fetcher.started.clear()
    names = [f"{n:032x}" for n in range(1, 21)]
    posts = [asyncio.create_task(endpoint.post(signed(cert_url(name)))) for name in names]
    await asyncio.wait_for(fetcher.started.wait(), 60)  # the first of them is being fetched, the others wait
    fetcher.release.set()
    answers = await asyncio.gather(*posts)
    assert sorted(status for status, _ in answers) == [200] * 2 + [503] * 18
    assert all(
        a["error"].startswith("signature not checked now: ") and "certificates fetched in the last 600 s" in a["error"]
        for st, a in answers
        if st == 503
    )
    assert len(fetcher.urls) == verifier.fetches == 3 and fetcher.most_at_once == 1

    # A cached certificate still serves; once the window has passed, a new one is fetched again.
    assert (await endpoint.post(signed(SNS_CERT_URL)))[0] == 200
    assert (await endpoint.post(signed(cert_url(names[-1]))))[0] == 503
    now[0] += 601
    assert (await endpoint.post(signed(cert_url(names[-1]))))[0] == 200
    assert len(fetcher.urls) == 4


def test_the_endpoint_needs_an_allowlist() -> None:
    with pytest.raises(ValueError, match="at least one allowed topic"):
        sns_routes(RecordingBus().publish, [], SnsVerifier())


@pytest.mark.parametrize(
    ("url", "allowed"),
    [
        ("https://sns.us-east-1.amazonaws.com/SimpleNotificationService-abc.pem", True),
        ("https://sns.cn-north-1.amazonaws.com.cn/SimpleNotificationService-abc.pem", True),
        ("https://SNS.EU-WEST-1.AMAZONAWS.COM/cert.pem", True),
        ("http://sns.us-east-1.amazonaws.com/cert.pem", False),
        ("https://sns.us-east-1.amazonaws.com.evil.example/cert.pem", False),
        ("https://evil.example/sns.us-east-1.amazonaws.com/cert.pem", False),
        ("https://user@sns.us-east-1.amazonaws.com/cert.pem", False),
        ("https://sns.us-east-1.amazonaws.com:notaport/cert.pem", False),
        ("https://s3.amazonaws.com/cert.pem", False),
        ("https://sns.us_east_1.amazonaws.com/cert.pem", False),
        (None, False),
    ],
)
def test_only_https_sns_hosts_are_trusted_by_default(url: str | None, allowed: bool) -> None:
    assert SnsVerifier().allows_url(url) is allowed


def test_the_string_to_sign_follows_the_documented_order() -> None:
    message = confirmation(TOPIC, "https://sns.us-east-1.amazonaws.com/?Action=ConfirmSubscription")
    expected = "".join(
        f"{key}\n{message[key]}\n"
        for key in ("Message", "MessageId", "SubscribeURL", "Timestamp", "Token", "TopicArn", "Type")
    )
    assert string_to_sign({**message, "Extra": "ignored"}) == expected.encode()
    plain = notification(TOPIC, "m")
    assert string_to_sign(plain).decode().split("\n")[::2][:5] == [
        "Message",
        "MessageId",
        "Timestamp",
        "TopicArn",
        "Type",
    ]
    assert is_allowed_url(SNS_CERT_URL, re.compile(r"sns\..*"), ("https",))


async def test_an_sns_http_subscription_on_moto_is_verified_with_snss_own_certificate(aws: str, serve: Serve) -> None:
    """moto POSTs a notification it signed (SignatureVersion 2) and serves the certificate; production URL rules."""

    async def from_moto(url: str) -> bytes:
        # The certificate URL names the real SNS host; moto serves the same path to requests signed for "sns".
        assert url.startswith("https://sns.us-east-1.amazonaws.com/")
        auth = (
            "AWS4-HMAC-SHA256 Credential=testing/20250101/us-east-1/sns/aws4_request, SignedHeaders=host, Signature=0"
        )
        async with (
            aiohttp.ClientSession() as session,
            session.get(
                aws + url.removeprefix("https://sns.us-east-1.amazonaws.com"), headers={"Authorization": auth}
            ) as r,
        ):
            assert r.status == 200
            return await r.read()

    sns = boto3.client("sns", endpoint_url=aws)
    topic = sns.create_topic(Name="finetune-events")["TopicArn"]
    bus = RecordingBus()
    confirmed = Confirmations()
    app = web.Application()
    app.add_routes(sns_routes(bus.publish, [topic], SnsVerifier(from_moto), confirm=confirmed))
    endpoint = await serve(app) + SNS_PATH
    sns.subscribe(TopicArn=topic, Protocol="http", Endpoint=endpoint)
    # moto delivers synchronously from its request thread, so publish off the event loop that runs the endpoint.
    # (No Subject: moto 5.2.5 leaves it out of the string it signs, which real SNS does not.)
    await asyncio.to_thread(sns.publish, TopicArn=topic, Message=spot_warning("i-0moto", event_id=EVENT_ID))

    [event] = bus.events
    message = parse_message(event)
    assert isinstance(message, CloudEvent)
    expected = ("spot-interruption", "i-0moto", event_message_id(EVENT_ID))
    assert (message.kind, message.instance_id, message.id) == expected


async def test_the_default_fetcher_refuses_redirects_and_oversized_bodies(serve: Serve) -> None:
    async def redirect(request: web.Request) -> web.Response:
        raise web.HTTPFound("https://sns.us-east-1.amazonaws.com/cert.pem")

    async def huge(request: web.Request) -> web.Response:
        return web.Response(body=b"x" * 100_000)

    app = web.Application()
    app.router.add_get("/redirect", redirect)
    app.router.add_get("/huge", huge)
    base = await serve(app)
    fetch: UrlFetcher = fetch_url
    with pytest.raises(Exception, match="answered 302"):
        await fetch(base + "/redirect")
    with pytest.raises(Exception, match="more than"):
        await fetch(base + "/huge")


async def test_a_report_counts_only_from_the_report_topic_and_signed_by_its_attempt(
    serve: Serve, cert_host: CertHost
) -> None:
    """IAM lets every runner publish to the report topic, and EventBridge's topic carries the cloud's word: a
    report is believed only on the first, with its attempt's signature; a cloud event only on the second."""
    report_topic = "arn:aws:sns:us-east-1:123456789012:finetune-reports"
    report, line = progress_report()
    salt = "5a" * 16  # what the store holds for the report's attempt

    async def salts(job_id: str, attempt: int) -> str | None:
        return salt if (job_id, attempt) == (report.job_id, report.attempt) else None

    gate = ReportGate("master-report-secret", salts, lambda job_id: f"s3://ft-bucket/jobs/{job_id}/")
    intake = AwsIntake(gate, report_topics=[report_topic], events_topics=[TOPIC], route="sns")
    bus, verifier = RecordingBus(), SnsVerifier(host_pattern=LOCAL_HOST, schemes=("http",))
    app = web.Application()
    app.add_routes(sns_routes(bus.publish, [TOPIC, report_topic], verifier, parse=intake.parse))
    endpoint = Endpoint(await serve(app) + SNS_PATH, bus, verifier, Confirmations())

    def published(topic: str, message: str, key: str | None = None) -> dict[str, Any]:
        body = notification(topic, message)
        if key is not None:
            now = int(datetime.now(UTC).timestamp())
            body["MessageAttributes"] = {
                "finetune_timestamp": {"Type": "String", "Value": str(now)},
                "finetune_signature": {"Type": "String", "Value": sign(key, now, message.encode())},
            }
        return cert_host.signer.sign(body, cert_host.url)

    own_key = ReportKeys("master-report-secret").of(report.job_id, report.attempt, salt)
    refused = [
        published(TOPIC, line, own_key),  # signed, but on the events topic
        published(report_topic, line),  # unsigned
        published(report_topic, line, ReportKeys("master-report-secret").of("ft-other", 1, salt)),  # another job's key
        published(report_topic, spot_warning("i-0forged", event_id=EVENT_ID)),  # the cloud's word from a runner
    ]
    for message in refused:
        status, answer = await endpoint.post(message)
        assert status == 403 and answer["error"] == "refused"
    assert bus.events == []
    assert gate.refused == {"sns": 3} and intake.events_refused == {"sns": 1}

    assert (await endpoint.post(published(report_topic, line, own_key)))[0] == 200
    assert (await endpoint.post(published(TOPIC, spot_warning("i-0real", event_id=EVENT_ID))))[0] == 200
    first, second = (parse_message(event) for event in bus.events)
    assert isinstance(first, ReportReceived) and first.report == report
    assert isinstance(second, CloudEvent) and second.instance_id == "i-0real"


async def test_a_report_sns_delivers_late_is_judged_by_when_sns_took_it(serve: Serve, cert_host: CertHost) -> None:
    """SNS retries an HTTPS delivery for up to an hour: a report it took, signed, ten minutes ago and delivers only
    now is taken (by the envelope's Timestamp, which SNS signed); the same report published again now is not."""
    report_topic = "arn:aws:sns:us-east-1:123456789012:finetune-reports"
    report, line = progress_report()
    salt = "5a" * 16  # what the store holds for the report's attempt

    async def salts(job_id: str, attempt: int) -> str | None:
        return salt if (job_id, attempt) == (report.job_id, report.attempt) else None

    gate = ReportGate("master-report-secret", salts, lambda job_id: f"s3://ft-bucket/jobs/{job_id}/")
    intake = AwsIntake(gate, report_topics=[report_topic], events_topics=[TOPIC], route="sns")
    bus, verifier = RecordingBus(), SnsVerifier(host_pattern=LOCAL_HOST, schemes=("http",))
    app = web.Application()
    app.add_routes(sns_routes(bus.publish, [report_topic], verifier, parse=intake.parse))
    endpoint = Endpoint(await serve(app) + SNS_PATH, bus, verifier, Confirmations())
    key = ReportKeys("master-report-secret").of(report.job_id, report.attempt, salt)
    then = datetime.now(UTC) - timedelta(minutes=10)
    signed_then = int(then.timestamp())

    def published(at: datetime) -> dict[str, Any]:
        body = notification(report_topic, line, at=at)
        body["MessageAttributes"] = {
            "finetune_timestamp": {"Type": "String", "Value": str(signed_then)},
            "finetune_signature": {"Type": "String", "Value": sign(key, signed_then, line.encode())},
        }
        return cert_host.signer.sign(body, cert_host.url)

    assert (await endpoint.post(published(then)))[0] == 200
    [taken] = (parse_message(event) for event in bus.events)
    assert isinstance(taken, ReportReceived) and taken.report == report
    status, answer = await endpoint.post(published(datetime.now(UTC)))
    assert status == 403 and answer["error"] == "refused"
    assert gate.refused == {"sns": 1} and len(bus.events) == 1

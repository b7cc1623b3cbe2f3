"""What a stranger can send to the running bot's HTTP routes: every hostile byte gets an answer below 500 (a 4xx
wherever the route reads what was poisoned), never a traceback in the log, and the bot stays healthy.

The routes are read from the running bot's own aiohttp router, so a route added later is in this test on the day
it is added: a route without an entry in :data:`ROUTES` fails the test (it is never skipped). The bot runs for
real with every route mounted (runner reports, Slack's HTTP mode, SNS, both Alibaba webhooks, both pager
webhooks, ``/costs``, health and metrics) on a real Valkey. Each route gets, beside what its real sender would
send (a signature, a token), the hostile set the security review found:

- each of its security headers non-ASCII (valid UTF-8) and holding raw bytes 0xFF (written to the socket as bytes:
  an HTTP client library would refuse or re-encode them);
- a JSON body nested 200,000 deep, and one holding half a surrogate pair (``"\\udcff"``, legal JSON whose string
  cannot be encoded);
- a body of 20 MiB;
- an id with a trailing newline, where the route takes one.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import pytest
from aiohttp import web

from bot import header_form
from bot.cloud.user_data import runner_boot_script
from bot.service import BotService
from fakes.bot_harness import SECRET, running_bot, slack_settings
from fakes.fake_pagers import OPSGENIE_WEBHOOK_TOKEN, PAGERDUTY_WEBHOOK_SECRET, opsgenie_ack, pagerduty_ack
from fakes.fake_slack import FakeSlack, form_body, signed_headers, slash_command
from handlers import safe_json
from handlers.errors import UnrecognisedMessage
from handlers.report_keys import claimed_sender, derive_report_key
from handlers.reports import Progress, dump_report
from handlers.signing import sign
from tests.aliyun_payloads import INTERRUPTION, cloudevent, interruption_content, notification

TOKEN = "a-long-shared-secret-token-0123"
COSTS_TOKEN = "finance-sheet-token-0123"
TOPIC = "arn:aws:sns:us-east-1:123456789012:finetune-events"
DEEP = b"[" * 200_000
LONE_SURROGATE = b'{"job_id": "\\udcff", "attempt": 1, "Type": "Notification", "event": {"id": "\\udcff"}}'
HUGE = b"x" * (20 * 1024 * 1024)

Headers = dict[str, bytes]


@dataclass(frozen=True)
class Route:
    """How to speak to one route as its real sender would, and what of it a stranger can poison.

    ``headers(body)``: the headers its sender puts beside ``body`` (so the body itself is what is tested);
    ``security``: the headers it authenticates or trusts (each is poisoned in turn); ``reads_body``: whether a
    hostile body must be refused (4xx), rather than just not answered with 5xx; ``newline``: a request naming an
    id with a trailing newline (path with query, body) and the statuses it may get, or None where it takes no id.
    """

    headers: Callable[[bytes], Headers]
    security: tuple[str, ...] = ()
    body: bytes = b"{}"
    reads_body: bool = True
    newline: tuple[str, bytes, frozenset[int]] | None = None
    surrogate: bytes = LONE_SURROGATE


def _bytes(headers: Mapping[str, str]) -> Headers:
    return {name: value.encode() for name, value in headers.items()}


def _report_headers(body: bytes) -> Headers:  # well-formed, signed with a key no attempt has
    now = int(time.time())
    return _bytes({"X-Finetune-Timestamp": str(now), "X-Finetune-Signature": "v1=" + "0" * 64})


def _signed_report(job_id: str) -> bytes:
    report = json.loads(dump_report(Progress(job_id="ft-abcd", attempt=1, step=3)))
    report["job_id"] = job_id
    return json.dumps(report).encode()


def _report_newline() -> tuple[str, bytes, frozenset[int]]:
    return "/runner/reports", _signed_report("ft-abcd\n"), frozenset({401})


def _slack_headers(body: bytes) -> Headers:
    return _bytes(signed_headers(body))


def _sns_headers(body: bytes) -> Headers:
    return _bytes({"Content-Type": "text/plain; charset=UTF-8", "x-amz-sns-message-type": "Notification"})


def _sns_body(topic: str) -> bytes:
    now = datetime.now(UTC).isoformat().replace("+00:00", "Z")
    envelope = {"Type": "Notification", "MessageId": "m-1", "TopicArn": topic, "Message": "{}", "Timestamp": now}
    return json.dumps(envelope).encode()


def _sns_surrogate() -> bytes:
    """An envelope that passes every check before the signature's, whose Message cannot be encoded to be verified."""
    envelope = json.loads(_sns_body(TOPIC))
    envelope.update(Message="@@", SignatureVersion="2", Signature="AAAA", SigningCertURL="https://sns.example/x.pem")
    return json.dumps(envelope).replace("@@", "\\udcff").encode()


def _aliyun_headers(body: bytes) -> Headers:
    return _bytes({"Content-Type": "application/json", "X-Finetune-Token": TOKEN, "X-Forwarded-Proto": "https"})


def _aliyun_bearer(body: bytes) -> Headers:
    return _bytes(
        {"Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}", "X-Forwarded-Proto": "https"}
    )


_INSTANCE = "i-bp1hostile0000000\n"


def _cloudmonitor_newline() -> bytes:
    at = datetime.now(timezone(timedelta(hours=8))).strftime("%Y%m%dT%H%M%S.000+0800")
    event = notification(INTERRUPTION, interruption_content(_INSTANCE), _INSTANCE, event_time=at)
    return json.dumps(event).encode()


def _eventbridge_newline() -> bytes:
    at = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    return json.dumps(cloudevent(INTERRUPTION, interruption_content(_INSTANCE), _INSTANCE, time=at)).encode()


def _pagerduty_headers(body: bytes) -> Headers:
    signature = hmac.new(PAGERDUTY_WEBHOOK_SECRET.encode(), body, hashlib.sha256).hexdigest()
    return _bytes({"Content-Type": "application/json", "X-PagerDuty-Signature": f"v1={signature}"})


def _opsgenie_headers(body: bytes) -> Headers:
    return _bytes({"Content-Type": "application/json", "X-Finetune-Token": OPSGENIE_WEBHOOK_TOKEN})


def _opsgenie_basic(body: bytes) -> Headers:
    credentials = base64.b64encode(f"opsgenie:{OPSGENIE_WEBHOOK_TOKEN}".encode()).decode()
    return _bytes({"Content-Type": "application/json", "Authorization": f"Basic {credentials}"})


def _costs_headers(body: bytes) -> Headers:
    return _bytes({"Authorization": f"Bearer {COSTS_TOKEN}"})


def _no_headers(body: bytes) -> Headers:
    return {"X-Anything": b"plain"}


_PAGE = "finetune-ft-abcd-1\n"
_ACK_AT = datetime.now(UTC)

# Every route the bot mounts, by (method, path): the test fails for a route missing here.
ROUTES: dict[tuple[str, str], Route] = {
    ("GET", "/healthz"): Route(_no_headers, ("X-Anything",), b"", reads_body=False),
    ("GET", "/metrics"): Route(_no_headers, ("X-Anything",), b"", reads_body=False),
    ("POST", "/runner/reports"): Route(
        _report_headers, ("X-Finetune-Timestamp", "X-Finetune-Signature"), newline=_report_newline()
    ),
    ("POST", "/slack/events"): Route(
        _slack_headers,
        ("X-Slack-Request-Timestamp", "X-Slack-Signature"),
        form_body(slash_command("list")),
        newline=("/slack/events", form_body(slash_command("stop ft-abcd\n")), frozenset({200})),
    ),
    ("POST", "/aws/sns"): Route(
        _sns_headers,
        ("x-amz-sns-message-type",),
        _sns_body(TOPIC),
        surrogate=_sns_surrogate(),
        newline=("/aws/sns", _sns_body(TOPIC + "\n"), frozenset({403})),
    ),
    ("POST", "/aliyun/cloudmonitor"): Route(
        _aliyun_headers,
        ("X-Finetune-Token", "X-Forwarded-Proto"),
        newline=("/aliyun/cloudmonitor", _cloudmonitor_newline(), frozenset({400})),
    ),
    ("POST", "/aliyun/eventbridge"): Route(
        _aliyun_bearer,
        ("Authorization", "X-Forwarded-Proto"),
        newline=("/aliyun/eventbridge", _eventbridge_newline(), frozenset({400})),
    ),
    ("POST", "/pagerduty/webhook"): Route(
        _pagerduty_headers,
        ("X-PagerDuty-Signature",),
        json.dumps(pagerduty_ack("finetune-ft-abcd-1", "Ana", _ACK_AT)).encode(),
        # A tool delivers every event of its subscription: one about no page of ours is answered 2xx ("not-ours").
        newline=("/pagerduty/webhook", json.dumps(pagerduty_ack(_PAGE, "Ana", _ACK_AT)).encode(), frozenset({200})),
    ),
    ("POST", "/opsgenie/webhook"): Route(
        _opsgenie_headers,
        ("X-Finetune-Token",),
        json.dumps(opsgenie_ack("finetune-ft-abcd-1", "Ana")).encode(),
        newline=("/opsgenie/webhook", json.dumps(opsgenie_ack(_PAGE, "Ana")).encode(), frozenset({200})),
    ),
    ("GET", "/costs"): Route(
        _costs_headers,
        ("Authorization",),
        b"",
        reads_body=False,
        newline=("/costs?team=" + quote("ml\n"), b"", frozenset({400})),
    ),
}
# The same routes once more, over the other way their senders authenticate (Basic for Opsgenie, the token header
# for EventBridge): both ways of reading a secret get the poisoned header.
OTHER_WAYS: dict[tuple[str, str], Route] = {
    ("POST", "/opsgenie/webhook"): Route(
        _opsgenie_basic, ("Authorization",), json.dumps(opsgenie_ack("finetune-ft-abcd-1", "Ana")).encode()
    ),
    ("POST", "/aliyun/eventbridge"): Route(_aliyun_headers, ("X-Finetune-Token",)),
    ("POST", "/aliyun/cloudmonitor"): Route(_aliyun_bearer, ("Authorization",)),
}


def poisoned(value: bytes) -> list[bytes]:
    """A header's value made hostile: non-ASCII text (UTF-8), raw 0xFF bytes, each alone and inside the real value."""
    return [
        "é".encode() * 40,
        b"v1=" + "é".encode() * 64,
        b"\xff" * 40,
        value[:3] + b"\xff" + value[3:],
        value + "é".encode(),
        b"Bearer " + b"\xff" * 24,
        b"Basic " + b"\xff" * 24,
    ]


async def raw_request(port: int, method: str, target: str, headers: Headers, body: bytes) -> int:
    """One request written to the socket as bytes (headers exactly as given); the status of the answer."""
    status, _answer = await raw_exchange(port, method, target, headers, body)
    return status


async def raw_exchange(port: int, method: str, target: str, headers: Headers, body: bytes) -> tuple[int, bytes]:
    """One request written to the socket as bytes (headers exactly as given); the answer's status and bytes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        lines = [f"{method} {target} HTTP/1.1".encode(), b"Host: 127.0.0.1", b"Connection: close"]
        lines.append(f"Content-Length: {len(body)}".encode())
        lines += [name.encode() + b": " + value for name, value in headers.items()]
        writer.write(b"\r\n".join(lines) + b"\r\n\r\n" + body)
        await writer.drain()
        status_line = await asyncio.wait_for(reader.readline(), 60)
        rest = await asyncio.wait_for(reader.read(), 60)
    finally:
        writer.close()
    return int(status_line.split()[1]), rest


async def big_request(port: int, method: str, path: str, headers: Headers, body: bytes) -> int:
    """A large body through an HTTP client (it reads the early answer while it still writes)."""
    url = f"http://127.0.0.1:{port}{path}"
    sent = {name: value.decode() for name, value in headers.items()}
    async with aiohttp.ClientSession() as http, http.request(method, url, data=body, headers=sent) as response:
        await response.read()
        return response.status


def mounted(service: BotService) -> set[tuple[str, str]]:
    """(method, path) of every route the running bot's router holds (HEAD is aiohttp's twin of each GET)."""
    runner = service._http
    assert runner is not None
    app: web.Application = runner.app
    found: set[tuple[str, str]] = set()
    for route in app.router.routes():
        info = route.resource.get_info() if route.resource is not None else {}
        path = info.get("path") or info.get("formatter")
        assert isinstance(path, str), f"a route the test cannot name: {route!r}"
        if route.method != "HEAD":
            found.add((route.method, path))
    return found


def problems(caplog: pytest.LogCaptureFixture) -> list[str]:
    """Every log record with a traceback, or at ERROR and above, from any logger."""
    return [
        f"{r.name}: {r.getMessage()[:200]}"
        for r in caplog.records
        if r.exc_info is not None or r.exc_text or r.levelno >= logging.ERROR or "Traceback" in r.getMessage()
    ]


@pytest.fixture
async def bot(tmp_path: Path) -> AsyncIterator[BotService]:
    async with FakeSlack() as slack:
        settings: dict[str, Any] = {
            "finetune_aliyun_webhook_token": TOKEN,
            "finetune_aliyun_webhook_allow_insecure": False,
            "finetune_sns_topics": TOPIC,
            "finetune_costs_token": COSTS_TOKEN,
            "pagerduty_webhook_secret": PAGERDUTY_WEBHOOK_SECRET,
            "opsgenie_webhook_token": OPSGENIE_WEBHOOK_TOKEN,
            **slack_settings(slack.api_url),
        }
        async with running_bot(tmp_path / "state", **settings) as (service, _console):
            yield service


async def test_every_route_the_router_holds_answers_the_hostile_set_below_500_without_a_traceback(
    bot: BotService, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    routes = mounted(bot)
    unknown = routes - ROUTES.keys()
    assert not unknown, f"routes with no hostile-request builder in ROUTES (add one): {sorted(unknown)}"
    assert routes == ROUTES.keys(), f"ROUTES names routes the bot does not mount: {sorted(ROUTES.keys() - routes)}"
    answers: list[tuple[str, str, str, int]] = []  # (route, case, what, status): every answer, for the message

    async def ask(key: tuple[str, str], route: Route, case: str, headers: Headers, body: bytes, refuse: bool) -> None:
        method, path = key
        if len(body) > 1024 * 1024:
            status = await big_request(bot.port, method, path, headers, body)
        else:
            status = await raw_request(bot.port, method, path, headers, body)
        answers.append((f"{method} {path}", case, "4xx" if refuse else "<500", status))

    for key, route in [*ROUTES.items(), *OTHER_WAYS.items()]:
        genuine = route.headers(route.body)
        for name in route.security:
            for index, value in enumerate(poisoned(genuine.get(name, b"x" * 16))):
                await ask(key, route, f"{name} #{index}", {**genuine, name: value}, route.body, name != "X-Anything")
        for case, body in (("deep JSON", DEEP), ("lone surrogate", route.surrogate), ("20 MiB", HUGE)):
            if key == ("POST", "/slack/events") and case != "20 MiB":
                body = form_body({"payload": body.decode()})  # Slack's interactions carry their JSON in a form field
            await ask(key, route, case, route.headers(body), body, route.reads_body)

    wrong = [answer for answer in answers if answer[3] >= 500 or (answer[2] == "4xx" and not 400 <= answer[3] < 500)]
    assert wrong == [], "\n".join(f"{route} {case}: {status} (expected {what})" for route, case, what, status in wrong)
    assert {answer[0] for answer in answers} == {f"{m} {p}" for m, p in ROUTES}  # every route was asked
    assert problems(caplog) == []
    assert await raw_request(bot.port, "GET", "/healthz", {}, b"") == 200


async def test_an_id_with_a_trailing_newline_is_refused_or_names_nothing_on_every_route_that_takes_one(
    bot: BotService, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    assert mounted(bot) == ROUTES.keys()
    for (method, _path), route in ROUTES.items():
        if route.newline is None:
            continue
        target, body, allowed = route.newline
        headers = route.headers(body)
        if target.startswith("/runner/reports"):  # signed with the key of the id, newline and all
            now = int(time.time())
            key = derive_report_key(SECRET, "ft-abcd\n", 1, "0" * 32)  # no attempt has a salt for it
            headers = _bytes({"X-Finetune-Timestamp": str(now), "X-Finetune-Signature": sign(key, now, body)})
        status, answer = await raw_exchange(bot.port, method, target, headers, body)
        assert status in allowed, (method, target, status, answer[-300:])
        if "webhook" in target:  # authentic, and about no page of ours: said so, and nothing acknowledged
            assert b'"outcome": "not-ours"' in answer, answer[-300:]
    assert await bot.bot.store.list_jobs() == []
    assert problems(caplog) == []


def test_a_pattern_that_guards_a_value_takes_the_whole_value() -> None:
    # "$" matches before a trailing newline; every guard takes the whole value, so the newline is refused.
    with pytest.raises(ValueError, match="ENV"):
        runner_boot_script({"ENV": "s3://bucket/spec.json\nEOF"}, "/opt/finetune")
    with pytest.raises(ValueError, match="ENV"):
        runner_boot_script({"ENV": "value\n"}, "/opt/finetune")
    with pytest.raises(ValueError, match="runner path"):
        runner_boot_script({}, "/opt/finetune\n")
    assert claimed_sender(b'{"job_id": "ft-abcd\\n", "attempt": 1}') is None
    assert claimed_sender(b'{"job_id": "ft-abcd", "attempt": 1}') is not None


def test_json_from_outside_is_read_within_a_size_and_a_depth_and_encodes() -> None:
    assert safe_json.loads(b'{"a": [1, {"b": 2}]}') == {"a": [1, {"b": 2}]}
    assert safe_json.loads(b'{"smile": "\\ud83d\\ude00"}') == {"smile": "\U0001f600"}  # a pair is one character
    hostile = (b"[" * 200_000, b"[" * 40 + b"]" * 40, b"x" * (2 * 1024 * 1024), b"\xff\xfe", b"{", LONE_SURROGATE)
    for document in (*hostile, b'{"\\ud800": 1}', b'["\\ude00\\ud83d"]'):
        with pytest.raises(UnrecognisedMessage):
            safe_json.loads(document)


def test_a_security_header_is_read_only_in_its_form() -> None:
    """bot/header_form.py: what a route gets is ASCII of the form's pattern, whole, within the length, or None."""
    good = "v1=" + "a" * 64
    assert header_form.REPORT_SIGNATURE.read({"X-Finetune-Signature": good}) == good
    for bad in ("v1=" + "é" * 64, "v1=" + "\udcff" * 64, good + "\n", " " + good, good.upper(), "v1=" + "a" * 63):
        assert header_form.REPORT_SIGNATURE.read({"X-Finetune-Signature": bad}) is None, bad
    assert header_form.REPORT_TIMESTAMP.read({"X-Finetune-Timestamp": "١٧٠٠٠٠٠٠٠٠"}) is None  # Arabic-Indic digits
    assert header_form.REPORT_TIMESTAMP.read({}) is None
    pagerduty = {"X-PagerDuty-Signature": f"v1={'a' * 64}, v1={'B' * 64}"}  # two while the secret rotates
    assert header_form.PAGERDUTY_SIGNATURE.read(pagerduty) == pagerduty["X-PagerDuty-Signature"]
    assert header_form.header_part(header_form.BEARER, {"Authorization": f"bearer  {TOKEN}"}, "token") == TOKEN
    assert header_form.header_part(header_form.BEARER, {"Authorization": f"Bearer {TOKEN}\udcff"}, "token") is None
    assert header_form.FINETUNE_TOKEN.read({"X-Finetune-Token": "x" * (header_form.MAX_HEADER_CHARS + 1)}) is None

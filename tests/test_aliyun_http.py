"""The Alibaba event routes on a real aiohttp server, publishing to the real event bus on the embedded Valkey: a push
with the token (from an allowed address) lands on the bus; anything else is refused and publishes nothing."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import redis.asyncio as aioredis
from aiohttp import web

from bot.bus import EVENT_FIELD, EventBus
from bot.cloud.aliyun.provider import AliyunCloud
from bot.errors import ConfigError
from bot.sources.aliyun_http import CLOUDMONITOR_PATH, EVENTBRIDGE_PATH, TOKEN_HEADER, aliyun_routes, parse_networks
from bot.store import DEDUP_TTL
from fakes.bot_harness import (
    SLEEPS,
    eventually,
    quick_recipe,
    running_bot,
    settled,
    start_job,
    wait_job,
    write_config,
)
from fakes.ports import free_port
from handlers.aliyun_events import MAX_AGE, event_message_id
from handlers.jobs import JobState
from handlers.messages import CloudEvent, parse_message
from tests.aliyun_payloads import (
    INTERRUPTION,
    STATE_CHANGE,
    cloudevent,
    interruption_content,
    notification,
    state_content,
    system_event_content,
)
from tests.redis_fixtures import (  # noqa: F401 - fixtures
    fixture_key_prefix,
    fixture_redis_client,
    fixture_redis_client_factory,
    fixture_valkey_url,
)

TOKEN = "a-long-shared-secret-token-0123"
WITH_TOKEN = {TOKEN_HEADER: TOKEN}
BEHIND_TLS = {"X-Forwarded-Proto": "https"}  # what the load balancer in front of the bot adds
INSTANCE = "i-bp1ecr0000005go2go"
PAYLOAD_TIME = datetime(2019, 4, 9, 4, 18, 26, 922000, tzinfo=UTC)  # the payloads' default event time
Post = Callable[..., Awaitable[tuple[int, Any]]]


class Intake:
    """The routes served on loopback, over a real bus; ``post`` sends a push, ``published`` reads the stream."""

    def __init__(self, url: str, bus: EventBus) -> None:
        self.url = url
        self.bus = bus

    async def post(
        self,
        path: str,
        document: Any,
        *,
        query: dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
        tls: bool = True,
    ) -> tuple[int, Any]:
        """POST as the load balancer forwards it (``tls``: it says https), or as plain http straight to the bot."""
        body = document if isinstance(document, str) else json.dumps(document)
        sent = {"Content-Type": "application/json", **(BEHIND_TLS if tls else {}), **(headers or {})}
        async with (
            aiohttp.ClientSession() as session,
            session.post(self.url + path, data=body, params=query or {}, headers=sent) as response,
        ):
            return response.status, await response.json()

    async def published(self) -> list[dict[str, Any]]:
        entries = await self.bus.redis.xrange(self.bus.stream)
        return [json.loads(fields[EVENT_FIELD]) for _, fields in entries]  # the bus client decodes


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[web.Application], Awaitable[str]]]:
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


@pytest.fixture
def make_intake(
    serve: Callable[[web.Application], Awaitable[str]], redis_client: aioredis.Redis, key_prefix: str
) -> Callable[..., Awaitable[Intake]]:
    async def make(
        sources: str = "",
        bus: EventBus | None = None,
        now: datetime = PAYLOAD_TIME + timedelta(minutes=1),
        allow_insecure: bool = False,
    ) -> Intake:
        bus = bus or EventBus(redis_client, stream=key_prefix + "events")
        app = web.Application()
        networks = parse_networks(sources)
        app.add_routes(aliyun_routes(bus.publish, TOKEN, networks, allow_insecure=allow_insecure, clock=lambda: now))
        return Intake(await serve(app), bus)

    return make


def warning() -> dict[str, Any]:
    return notification(INTERRUPTION, interruption_content(INSTANCE), INSTANCE)


async def test_a_push_with_the_token_is_published(make_intake: Callable[..., Awaitable[Intake]]) -> None:
    intake = await make_intake()
    status, answer = await intake.post(CLOUDMONITOR_PATH, warning(), headers=WITH_TOKEN)
    assert status == 200
    (event,) = await intake.published()
    message = parse_message(event)
    assert isinstance(message, CloudEvent)
    assert (message.kind, message.instance_id, message.id) == (
        "spot-interruption",
        INSTANCE,
        event_message_id("spot-interruption", INSTANCE),
    )
    assert answer == {"accepted": [message.id]}


async def test_the_token_may_come_in_a_header(make_intake: Callable[..., Awaitable[Intake]]) -> None:
    intake = await make_intake()
    for headers in ({"X-Finetune-Token": TOKEN}, {"Authorization": f"Bearer {TOKEN}"}):
        status, _ = await intake.post(CLOUDMONITOR_PATH, warning(), headers=headers)
        assert status == 200
    assert len(await intake.published()) == 2  # a redelivery is published again; the bus dedups by its id


async def test_eventbridge_cloudevents_have_their_own_route(make_intake: Callable[..., Awaitable[Intake]]) -> None:
    intake = await make_intake()
    gone = cloudevent(STATE_CHANGE, state_content(INSTANCE, "Deleted"), INSTANCE)
    status, _ = await intake.post(EVENTBRIDGE_PATH, gone, headers=WITH_TOKEN)
    assert status == 200
    (event,) = await intake.published()
    assert (event["kind"], event["instance_id"]) == ("instance-gone", INSTANCE)
    status, answer = await intake.post(CLOUDMONITOR_PATH, gone, headers=WITH_TOKEN)
    assert status == 400 and "EventBridge" in answer["reason"]


async def test_a_scheduled_system_event_is_published_as_an_early_signal_and_a_malformed_one_refused(
    make_intake: Callable[..., Awaitable[Intake]],
) -> None:
    intake = await make_intake()
    maintenance = "Instance:SystemMaintenance.Reboot"
    pushed = notification(f"{maintenance}:Scheduled", system_event_content(INSTANCE), INSTANCE, level="CRITICAL")
    status, answer = await intake.post(CLOUDMONITOR_PATH, pushed, headers=WITH_TOKEN)
    assert status == 200
    (event,) = await intake.published()
    message = parse_message(event)
    assert isinstance(message, CloudEvent) and answer == {"accepted": [message.id]}
    assert (message.kind, message.instance_id, message.detail) == (
        "scheduled-event",
        INSTANCE,
        "SystemMaintenance.Reboot",
    )
    assert message.deadline == datetime(2019, 4, 12, 1, 1, 1, tzinfo=UTC)  # notBefore

    odd = notification(f"{maintenance}:Scheduled", {**system_event_content(INSTANCE), "eventStatus": "Soon"}, INSTANCE)
    status, answer = await intake.post(CLOUDMONITOR_PATH, odd, headers=WITH_TOKEN)
    assert status == 400 and "unknown status 'Soon'" in answer["reason"]
    over = notification(f"{maintenance}:Executed", system_event_content(INSTANCE, status="Executed"), INSTANCE)
    assert await intake.post(CLOUDMONITOR_PATH, over, headers=WITH_TOKEN) == (200, {"accepted": []})
    assert len(await intake.published()) == 1  # neither the refused nor the finished one published anything


async def test_a_live_state_is_accepted_and_publishes_nothing(make_intake: Callable[..., Awaitable[Intake]]) -> None:
    intake = await make_intake()
    running = notification(STATE_CHANGE, state_content(INSTANCE, "Running"), INSTANCE)
    assert await intake.post(CLOUDMONITOR_PATH, running, headers=WITH_TOKEN) == (200, {"accepted": []})
    assert await intake.published() == []


@pytest.mark.parametrize(
    ("query", "headers"),
    [
        ({}, {}),
        ({}, {"X-Finetune-Token": "a-long-shared-secret-token-0124"}),
        ({}, {"X-Finetune-Token": TOKEN[:-1]}),
        ({}, {"X-Finetune-Token": "wrong"}),
        ({}, {"Authorization": "Basic " + TOKEN}),
    ],
)
async def test_without_the_token_nothing_is_published(
    make_intake: Callable[..., Awaitable[Intake]], query: dict[str, str], headers: dict[str, str]
) -> None:
    intake = await make_intake()
    for path in (CLOUDMONITOR_PATH, EVENTBRIDGE_PATH):
        status, answer = await intake.post(path, warning(), query=query, headers=headers)
        assert (status, answer) == (401, {"error": "missing or wrong token"})
    assert await intake.published() == []


async def test_a_token_in_the_url_is_refused_even_beside_the_right_header(
    make_intake: Callable[..., Awaitable[Intake]],
) -> None:
    intake = await make_intake()
    for query in ({"token": TOKEN}, {"token": "whatever-else-0123456789"}):
        for path in (CLOUDMONITOR_PATH, EVENTBRIDGE_PATH):
            status, answer = await intake.post(path, warning(), query=query, headers=WITH_TOKEN)
            assert status == 400 and "token in the URL is refused" in answer["error"], answer
    assert await intake.published() == []


async def test_plain_http_is_refused_unless_allowed_for_a_local_test(
    make_intake: Callable[..., Awaitable[Intake]],
) -> None:
    intake = await make_intake()
    for headers in (WITH_TOKEN, {**WITH_TOKEN, "X-Forwarded-Proto": "http"}):
        status, answer = await intake.post(CLOUDMONITOR_PATH, warning(), headers=headers, tls=False)
        assert (status, answer) == (403, {"error": "plain http refused: the token travels over https only"})
    assert await intake.published() == []
    local = await make_intake(allow_insecure=True)
    assert (await local.post(CLOUDMONITOR_PATH, warning(), headers=WITH_TOKEN, tls=False))[0] == 200
    assert len(await local.published()) == 1


async def test_source_networks_are_enforced_before_the_token(make_intake: Callable[..., Awaitable[Intake]]) -> None:
    elsewhere = await make_intake(sources="100.104.0.0/16, 10.0.0.0/8")
    status, answer = await elsewhere.post(CLOUDMONITOR_PATH, warning(), headers=WITH_TOKEN)
    assert status == 403 and "127.0.0.1 is not allowed" in answer["error"]
    assert await elsewhere.published() == []

    loopback = await make_intake(sources="10.0.0.0/8,127.0.0.1")
    status, _ = await loopback.post(CLOUDMONITOR_PATH, warning(), headers=WITH_TOKEN)
    assert status == 200
    assert len(await loopback.published()) == 1


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ("{not json", "not JSON"),
        (json.dumps(notification("Disk:Stalled", {"diskId": "d-1"}, INSTANCE)), "not one this bot handles"),
        (json.dumps({"hello": "world"}), "malformed CloudMonitor system event"),
    ],
)
async def test_malformed_pushes_are_refused_with_the_reason(
    make_intake: Callable[..., Awaitable[Intake]], body: str, reason: str
) -> None:
    intake = await make_intake()
    status, answer = await intake.post(CLOUDMONITOR_PATH, body, headers=WITH_TOKEN)
    assert status == 400
    assert answer["error"] == "unrecognised event" and reason in answer["reason"]
    assert await intake.published() == []


async def test_a_bus_that_cannot_take_it_asks_for_a_retry(make_intake: Callable[..., Awaitable[Intake]]) -> None:
    unreachable = aioredis.Redis.from_url(f"redis://127.0.0.1:{free_port()}/0", socket_connect_timeout=1)
    try:
        intake = await make_intake(bus=EventBus(unreachable, stream="nowhere:events"))
        status, answer = await intake.post(CLOUDMONITOR_PATH, warning(), headers=WITH_TOKEN)
    finally:
        await unreachable.aclose()
    assert (status, answer) == (503, {"error": "bus unavailable, retry"})


@pytest.mark.parametrize(
    ("age", "why"),
    [
        (MAX_AGE + timedelta(minutes=1), "more than 1 day, 1:00:00 ago: a replay"),
        (timedelta(days=8), "a replay"),  # what a captured push is once the 7-day dedup has forgotten it
        (-timedelta(minutes=30), "in the future"),
    ],
)
async def test_pushes_outside_the_freshness_window_are_refused(
    make_intake: Callable[..., Awaitable[Intake]], age: timedelta, why: str
) -> None:
    intake = await make_intake(now=PAYLOAD_TIME + age)
    bridged = cloudevent(STATE_CHANGE, state_content(INSTANCE, "Deleted"), INSTANCE)
    for path, push in ((CLOUDMONITOR_PATH, warning()), (EVENTBRIDGE_PATH, bridged)):
        status, answer = await intake.post(path, push, headers={"Authorization": f"Bearer {TOKEN}"})
        assert status == 403 and why in answer["error"], answer
    assert await intake.published() == []


async def test_a_push_a_day_late_is_still_taken(make_intake: Callable[..., Awaitable[Intake]]) -> None:
    intake = await make_intake(now=PAYLOAD_TIME + timedelta(hours=24))  # EventBridge retries for up to a day
    assert (await intake.post(CLOUDMONITOR_PATH, warning(), headers=WITH_TOKEN))[0] == 200
    assert len(await intake.published()) == 1


def test_the_freshness_window_is_well_inside_the_dedup_of_event_ids() -> None:
    assert timedelta(seconds=DEDUP_TTL) / 2 > MAX_AGE  # so a captured push is deduplicated or too old, never new


async def test_the_token_is_never_logged(
    make_intake: Callable[..., Awaitable[Intake]], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    intake = await make_intake()
    await intake.post(CLOUDMONITOR_PATH, warning(), headers=WITH_TOKEN)
    await intake.post(CLOUDMONITOR_PATH, "{not json", headers=WITH_TOKEN)
    await intake.post(CLOUDMONITOR_PATH, warning(), headers={TOKEN_HEADER: TOKEN[:-1] + "x"})
    stale = await make_intake(now=PAYLOAD_TIME + timedelta(days=3))
    await stale.post(EVENTBRIDGE_PATH, warning(), headers={"X-Finetune-Token": TOKEN})
    assert caplog.records and not [r for r in caplog.records if TOKEN[:12] in r.getMessage()]


def test_the_routes_refuse_a_weak_token_and_unreadable_networks() -> None:
    async def publish(event: dict[str, Any]) -> str:
        raise AssertionError("never called")

    with pytest.raises(ValueError, match="at least 16"):
        aliyun_routes(publish, "short")
    with pytest.raises(ValueError, match=r"'10\.0\.0\.0/33'"):
        parse_networks("10.0.0.0/8, 10.0.0.0/33")
    assert [str(n) for n in parse_networks(" 10.1.2.3 , ,::1 ")] == ["10.1.2.3/32", "::1/128"]


# -- wired into the bot --------------------------------------------------------------------------------------


async def test_a_cloudmonitor_warning_reaches_the_running_bot_and_alerts_once(tmp_path: Path) -> None:
    config = write_config(tmp_path / "bot.yaml", recipes=[quick_recipe("sleepy", SLEEPS)])
    async with running_bot(tmp_path / "state", config, finetune_aliyun_webhook_token=TOKEN) as (service, chat):
        job_id = await start_job(service, "console:ana", "start sleepy")
        running = await wait_job(service, job_id, lambda job: job.state is JobState.RUNNING)
        assert running.current is not None and running.current.instance_id
        instance_id = running.current.instance_id
        url = f"http://127.0.0.1:{service.port}{CLOUDMONITOR_PATH}"
        now = datetime.now(UTC).strftime("%Y%m%dT%H%M%S.000%z")
        push = notification(INTERRUPTION, interruption_content(instance_id), instance_id, event_time=now)
        async with aiohttp.ClientSession() as session:
            for _ in range(2):  # the push channel redelivers; the same event alerts once
                async with session.post(url, json=push, headers={**WITH_TOKEN, **BEHIND_TLS}) as response:
                    assert response.status == 200
            async with session.post(url, json=push, headers=BEHIND_TLS) as response:
                assert response.status == 401
            async with session.post(url, json=push, headers=WITH_TOKEN) as response:
                assert response.status == 403  # plain http: the bot is not told to allow it
        warned = await wait_job(service, job_id, lambda job: job.state is JobState.INTERRUPTED)
        assert warned.interruptions == 1
        await eventually(lambda: settled(service))  # both pushes handled, and every note they made posted
        alerts = [text for job, channel, text in chat.transcript if job == job_id and channel == "alert"]
        assert len(alerts) == 1 and "acs.ecs" in alerts[0]


@pytest.mark.parametrize(
    ("settings", "config", "message"),
    [
        ({"finetune_cloud": "aliyun"}, {}, "needs an aliyun: section"),
        ({"finetune_aliyun_webhook_token": "short"}, {}, "at least 16"),
        (
            {"finetune_aliyun_webhook_token": TOKEN, "finetune_aliyun_webhook_sources": "10.0.0.0/8,nowhere"},
            {},
            "FINETUNE_ALIYUN_WEBHOOK_SOURCES: 'nowhere'",
        ),
    ],
)
async def test_the_bot_refuses_an_unusable_alibaba_setup(
    tmp_path: Path, settings: dict[str, Any], config: dict[str, Any], message: str
) -> None:
    path = write_config(tmp_path / "bot.yaml", **config)
    with pytest.raises(ConfigError, match=message):
        async with running_bot(tmp_path / "state", path, **settings):
            pass


SECTION = {"region": "cn-hangzhou", "bucket": "ft-oss", "image_id": "m-1", "vswitches": {"cn-hangzhou-j": "v-j"}}
STATIC_KEY = "a long-lived access key is for a local test only"


async def test_the_bot_takes_no_long_lived_alibaba_key_unless_told_it_is_a_local_test(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    keyed = {**SECTION, "access_key_id": "LTAI-long-lived", "access_key_secret": "never-expires"}
    with pytest.raises(ConfigError, match=f"access_key_id: {STATIC_KEY}"):
        async with running_bot(
            tmp_path / "a", write_config(tmp_path / "a.yaml", aliyun=keyed), finetune_cloud="aliyun"
        ):
            pass
    monkeypatch.setenv("ALIBABA_CLOUD_ACCESS_KEY_ID", "LTAI-long-lived")
    monkeypatch.setenv("ALIBABA_CLOUD_ACCESS_KEY_SECRET", "never-expires")
    monkeypatch.delenv("ALIBABA_CLOUD_SECURITY_TOKEN", raising=False)
    plain = write_config(tmp_path / "b.yaml", aliyun=SECTION)
    with pytest.raises(
        ConfigError, match=f"ALIBABA_CLOUD_ACCESS_KEY_ID without ALIBABA_CLOUD_SECURITY_TOKEN: {STATIC_KEY}"
    ):
        async with running_bot(tmp_path / "b", plain, finetune_cloud="aliyun"):
            pass
    # An STS key (with its token), or a test that says it is one, is taken.
    monkeypatch.setenv("ALIBABA_CLOUD_SECURITY_TOKEN", "sts-token")
    async with running_bot(tmp_path / "c", plain, finetune_cloud="aliyun") as (service, _):
        assert isinstance(service.bot.cloud, AliyunCloud)
    monkeypatch.delenv("ALIBABA_CLOUD_SECURITY_TOKEN")
    allowed = write_config(tmp_path / "d.yaml", aliyun={**keyed, "allow_static_keys": True})
    async with running_bot(tmp_path / "d", allowed, finetune_cloud="aliyun") as (service, _):
        assert isinstance(service.bot.cloud, AliyunCloud)


def test_a_long_lived_alibaba_key_stops_the_bot_with_one_line_and_exit_code_2(tmp_path: Path) -> None:
    keyed = {**SECTION, "access_key_id": "LTAI-long-lived", "access_key_secret": "never-expires"}
    config = write_config(tmp_path / "bot.yaml", aliyun=keyed)
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    env |= {"FINETUNE_CLOUD": "aliyun", "FINETUNE_CONFIG": str(config), "FINETUNE_STATE_DIR": str(tmp_path / "s")}
    ran = subprocess.run(
        [sys.executable, "-m", "bot.cli", "serve"], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert ran.returncode == 2
    assert ran.stderr.splitlines() == [
        f"finetune-bot: {config}: aliyun: Value error, access_key_id: {STATIC_KEY}"
        " (allow_static_keys: true); deployed, the bot uses its instance RAM role's"
        " STS credentials (ALIBABA_CLOUD_ECS_METADATA)"
    ]
    assert "never-expires" not in ran.stderr


async def test_finetune_cloud_aliyun_runs_the_alibaba_provider(tmp_path: Path) -> None:
    section = {"region": "cn-hangzhou", "bucket": "ft-oss", "image_id": "m-1", "vswitches": {"cn-hangzhou-j": "v-j"}}
    config = write_config(tmp_path / "bot.yaml", aliyun=section)
    async with running_bot(tmp_path / "state", config, finetune_cloud="aliyun") as (service, _):
        assert isinstance(service.bot.cloud, AliyunCloud)
        assert service.bot.cloud.checkpoint_uri("ft-7k2q") == "oss://ft-oss/jobs/ft-7k2q/"

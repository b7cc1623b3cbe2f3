"""Notice watchers against a real local metadata service (IMDSv2 tokens, Alibaba termination-time)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import aiohttp
import pytest
from aiohttp import web

from bot.cloud.local.metadata import LocalMetadataServer
from fakes.ports import free_port
from handlers.reports import InstanceNotice
from runner.notices.aliyun import AliyunMetadataSource
from runner.notices.aws import AwsImdsSource
from runner.notices.base import NoticeUnavailable
from runner.notices.watch import watch_notices


@pytest.fixture
async def imds() -> AsyncIterator[LocalMetadataServer]:
    server = await LocalMetadataServer(instance_id="i-0abc123").start()
    yield server
    await server.stop()


async def test_imds_refuses_requests_without_a_token(imds: LocalMetadataServer) -> None:
    async with aiohttp.ClientSession() as http:
        async with http.get(imds.endpoint + "/latest/meta-data/spot/instance-action") as response:
            assert response.status == 401
        async with http.put(imds.endpoint + "/latest/api/token") as response:
            assert response.status == 400


async def test_aws_source_sees_nothing_then_the_interruption_and_rebalance(imds: LocalMetadataServer) -> None:
    source = AwsImdsSource(imds.endpoint)
    try:
        assert await source.poll() == []
        assert await source.instance_id() == "i-0abc123"
        deadline = imds.interrupt(seconds=120)
        imds.recommend_rebalance()
        notices = await source.poll()
        assert [notice.kind for notice in notices] == ["spot-interruption", "rebalance"]
        assert notices[0].deadline == deadline.replace(microsecond=0)
        assert notices[0].interrupts and not notices[1].interrupts
    finally:
        await source.close()


async def test_aws_source_honours_the_endpoint_variable(
    imds: LocalMetadataServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", imds.endpoint + "/")
    source = AwsImdsSource()
    try:
        assert source.base == imds.endpoint
        assert await source.instance_id() == "i-0abc123"
    finally:
        await source.close()


async def test_token_is_renewed_before_expiry_and_after_a_401(imds: LocalMetadataServer) -> None:
    now = [1000.0]  # the source's clock, moved by the test: no poll races a real TTL
    source = AwsImdsSource(imds.endpoint, token_ttl=10, clock=lambda: now[0])
    try:
        await source.poll()
        assert imds.token_requests == 1
        now[0] += 7.9
        await source.poll()
        assert imds.token_requests == 1  # reused while fresh (renewed at 80% of the TTL)
        now[0] += 0.2  # past 80% of the 10 s TTL
        await source.poll()
        assert imds.token_requests == 2
        imds.expire_tokens()  # the service forgot every token: the next poll gets a 401 and retries
        imds.interrupt(seconds=60)
        notices = await source.poll()
        assert imds.token_requests == 3
        assert [notice.kind for notice in notices] == ["spot-interruption"]
    finally:
        await source.close()


async def test_unreachable_metadata_raises_notice_unavailable() -> None:
    source = AwsImdsSource(f"http://127.0.0.1:{free_port()}")
    try:
        with pytest.raises(NoticeUnavailable, match=r"^PUT /latest/api/token: "):  # no token without an answer
            await source.poll()
        assert await source.instance_id(tries=1) is None
    finally:
        await source.close()


async def test_the_instance_id_survives_a_metadata_service_that_fails_its_first_answer() -> None:
    """The runner reads its instance id once, at start, and needs it later (a release): one failed answer (a 503, as
    a busy service gives) must not leave it unknown."""
    asked: list[str] = []

    async def token(request: web.Request) -> web.Response:
        return web.Response(text="token")

    async def instance_id(request: web.Request) -> web.Response:
        asked.append(request.headers.get("X-aws-ec2-metadata-token", ""))
        if len(asked) == 1:
            return web.Response(status=503)
        return web.Response(text="i-0abc123")

    app = web.Application()
    app.router.add_put("/latest/api/token", token)
    app.router.add_get("/latest/meta-data/instance-id", instance_id)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    source = AwsImdsSource(f"http://127.0.0.1:{port}")
    try:
        assert await source.instance_id() == "i-0abc123"
        assert asked == ["token", "token"]
    finally:
        await source.close()
        await runner.cleanup()


@pytest.mark.scenario
async def test_aliyun_metadata_in_hardened_mode_refuses_reads_without_a_token() -> None:
    server = await LocalMetadataServer(dialect="aliyun", instance_id="i-bp1xyz").start()
    server.interrupt(seconds=300)
    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(server.endpoint + "/latest/meta-data/instance/spot/termination-time") as response:
                assert response.status == 401
            aws_ttl = {"X-aws-ec2-metadata-token-ttl-seconds": "60"}  # the other cloud's header is no way in
            async with http.put(server.endpoint + "/latest/api/token", headers=aws_ttl) as response:
                assert response.status == 400
    finally:
        await server.stop()
    assert server.refused_without_token == 1


@pytest.mark.scenario
async def test_aliyun_termination_time_read_with_a_session_token() -> None:
    server = await LocalMetadataServer(dialect="aliyun", instance_id="i-bp1xyz").start()
    source = AliyunMetadataSource(server.endpoint, token_ttl=60)
    try:
        assert await source.poll() == []
        assert await source.instance_id() == "i-bp1xyz"
        deadline = server.interrupt(seconds=300)
        [notice] = await source.poll()
        assert notice.kind == "spot-interruption"  # the one word for it, from both clouds
        assert notice.deadline == deadline.replace(microsecond=0)
        assert server.token_requests == 1 and server.refused_without_token == 0
        server.expire_tokens()  # the service restarted: a 401, a fresh token, the same answer
        [again] = await source.poll()
        assert again.deadline == notice.deadline and server.token_requests == 2
    finally:
        await source.close()
        await server.stop()


class CountedSource:
    """A real source that counts its polls, so the test waits for rounds of the watcher instead of the clock."""

    def __init__(self, inner: AwsImdsSource) -> None:
        self.inner = inner
        self.name = inner.name
        self.answered = asyncio.Event()  # set as each poll returns (or raises)

    async def poll(self) -> list[InstanceNotice]:
        try:
            return await self.inner.poll()
        finally:
            self.answered.set()

    async def instance_id(self) -> str | None:
        return await self.inner.instance_id()

    async def close(self) -> None:
        await self.inner.close()


async def test_watcher_hands_each_notice_over_once_and_reports_an_outage_once(imds: LocalMetadataServer) -> None:
    source = CountedSource(AwsImdsSource(imds.endpoint))
    notices: asyncio.Queue[InstanceNotice] = asyncio.Queue()
    outages: list[str] = []
    watcher = asyncio.create_task(watch_notices(source, notices, outages.append, interval=0.05))
    try:

        async def polled(times: int) -> None:
            """``times`` more polls were answered, and every one but the last was dealt with by the watcher."""
            for _ in range(times):
                source.answered.clear()
                await asyncio.wait_for(source.answered.wait(), 60)

        imds.down = True
        await polled(6)  # five failed polls dealt with
        assert len(outages) == 1 and "unreachable" in outages[0]
        imds.down = False
        imds.recommend_rebalance()
        first = await asyncio.wait_for(notices.get(), 60)
        assert first.kind == "rebalance"
        imds.interrupt(seconds=100)
        second = await asyncio.wait_for(notices.get(), 60)
        assert second.kind == "spot-interruption"
        assert second.deadline is not None and second.deadline > datetime.now(UTC) + timedelta(seconds=90)
        await polled(4)  # still standing on the service, seen again and again, but never handed over twice
        assert notices.empty()
        imds.down = True
        await polled(4)
        assert len(outages) == 2  # a new outage is reported again, once
    finally:
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
        await source.close()

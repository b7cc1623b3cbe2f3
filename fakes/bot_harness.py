"""Run the real bot service (embedded Valkey, HTTP server, local cloud, console chat) inside a test."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import yaml

from bot.bus_set import Bus, BusSet
from bot.chat.console import ConsoleChat
from bot.cloud.local.provider import LocalCloud
from bot.errors import StoreUnavailable
from bot.service import BotService, CloudFactory, open_cloud
from bot.settings import Settings
from fakes.fake_dingtalk import FakeDingTalk
from handlers.clock import utcnow
from handlers.jobs import ChatRef, Job
from handlers.report_keys import claimed_sender, derive_report_key
from handlers.signing import SIGNATURE_HEADER, TIMESTAMP_HEADER, sign

CHANNEL = ChatRef(platform="console", channel="test")
SECRET = "test-report-secret"  # the bot's master report secret: no runner ever holds it


def report_headers(body: bytes, now: int | None = None, *, salt: str, master: str = SECRET) -> dict[str, str]:
    """The headers a runner sends with ``body``: signed with the key of the (job, attempt) the report names, whose
    key salt is ``salt`` (:func:`attempt_salt`)."""
    sender = claimed_sender(body)
    assert sender is not None, "a report body names its job and attempt"
    at = int(time.time()) if now is None else now
    key = derive_report_key(master, sender.job_id, sender.attempt, salt)
    return {TIMESTAMP_HEADER: str(at), SIGNATURE_HEADER: sign(key, at, body)}


async def attempt_salt(service: BotService, job_id: str, attempt: int) -> str:
    """The key salt the bot's store holds for the job's attempt (what its report key is derived from)."""
    salt = await service.bot.store.key_salt(job_id, attempt)
    assert salt is not None, f"the store holds no attempt {attempt} of {job_id}"
    return salt


def quick_recipe(name: str, code: str) -> dict[str, Any]:
    """A recipe whose trainer is a few lines of Python: for paths where what it trains does not matter."""
    return {"name": name, "description": name, "model": "none", "command": ["{python}", "-c", code]}


# Writes checkpoint-1 (complete), then on a fresh start trains until SIGTERM; when resumed it crashes.
FAILS_ON_RESUME = """
import os, pathlib, signal, sys, time, json
out = pathlib.Path(os.environ['FINETUNE_OUTPUT_DIR'])
if os.environ.get('FINETUNE_RESUME_FROM'):
    print('cannot load checkpoint: CUDA error'); sys.exit(3)
stop = []
signal.signal(signal.SIGTERM, lambda *a: stop.append(1))
step = 0
while not stop:
    step += 1
    pathlib.Path(os.environ['FINETUNE_PROGRESS_FILE']).open('a').write(json.dumps({'step': step}) + '\\n')
    time.sleep(0.1)
ckpt = out / ('checkpoint-%d' % step)
ckpt.mkdir(parents=True)
(ckpt / 'state.json').write_text('{}')
(ckpt / '.finetune-complete').touch()
"""

SLEEPS = "import time; time.sleep(600)"
# A relaunch at once after an attempt that made no progress (a SLEEPS job's always): a test of something else need not
# wait out the lifecycle's default pause of 30 s (``policy.lifecycle.relaunch_pause_seconds``).
NO_RELAUNCH_PAUSE = {"lifecycle": {"relaunch_pause_seconds": 0}}

# Counts steps; on SIGTERM (a notice, an interrupt test, a stop) saves checkpoint-<step> (marked complete) and exits;
# resumed from a checkpoint, it trains three more steps and finishes.
INTERRUPTIBLE = """
import json, os, pathlib, signal, sys, time
out = pathlib.Path(os.environ['FINETUNE_OUTPUT_DIR'])
progress = pathlib.Path(os.environ['FINETUNE_PROGRESS_FILE'])
resumed = os.environ.get('FINETUNE_RESUME_FROM')
stop = []
signal.signal(signal.SIGTERM, lambda *a: stop.append(1))
step = int(pathlib.Path(resumed).name.split('-')[1]) if resumed else 0
limit = step + 3 if resumed else 10**9
while not stop and step < limit:
    step += 1
    with progress.open('a') as file:
        file.write(json.dumps({'step': step, 'total_steps': 1000}) + '\\n')
    time.sleep(0.1)
if stop:
    ckpt = out / ('checkpoint-%d' % step)
    ckpt.mkdir(parents=True)
    (ckpt / 'state.json').write_text(json.dumps({'step': step}))
    (ckpt / '.finetune-complete').touch()
sys.exit(0)
"""


class SteppedClock:
    """Real time plus an offset the test moves forward: timers due "in 5 minutes" fire when it says so."""

    def __init__(self) -> None:
        self.offset = timedelta()

    def __call__(self) -> datetime:
        return utcnow() + self.offset

    def advance(self, minutes: float) -> None:
        self.offset += timedelta(minutes=minutes)


def slack_settings(api_url: str, socket_mode: bool = False, **override: Any) -> dict[str, Any]:
    """Settings for running_bot(**…) that turn on the Slack adapter against a local fake (fakes/fake_slack.py)."""
    from fakes.fake_slack import APP_TOKEN, BOT_TOKEN, SIGNING_SECRET

    settings: dict[str, Any] = {"slack_bot_token": BOT_TOKEN, "slack_api_url": api_url}
    if socket_mode:
        settings["slack_app_token"] = APP_TOKEN
    else:
        settings["slack_signing_secret"] = SIGNING_SECRET
    settings.update(override)
    return settings


def write_config(path: Path, **config: Any) -> Path:
    path.write_text(yaml.safe_dump(config))
    return path


@asynccontextmanager
async def running_bot(
    state_dir: Path,
    config: Path | None = None,
    redis_url: str | None = None,
    grace: float = 20.0,
    cloud: CloudFactory = open_cloud,
    clock: Callable[[], datetime] = utcnow,
    keep_instances: bool = False,
    **extra: Any,
) -> AsyncIterator[tuple[BotService, ConsoleChat]]:
    """The bot, until the block ends; then its local cloud's instances are reclaimed (they outlive a bot, as a
    cloud's do) unless ``keep_instances``."""
    settings = Settings(
        finetune_state_dir=state_dir,
        finetune_http_port=0,
        finetune_config=config,
        finetune_report_secret=SECRET,
        redis_url=redis_url,
        finetune_local_grace_seconds=grace,
        **extra,
    )
    lines: list[str] = []
    chat = ConsoleChat(write=lines.append)
    service = await BotService(settings, chat, cloud, clock=clock).start()

    async def reclaim() -> None:
        if not keep_instances and isinstance(service.bot.cloud, LocalCloud):
            await service.bot.cloud.terminate_all()

    try:
        yield service, chat
    finally:
        await service.stop(before_close=reclaim)  # the bot stops first: it relaunches nothing meanwhile


@asynccontextmanager
async def running_dingtalk_bot(
    state_dir: Path, dingtalk: FakeDingTalk, config: Path | None = None, **extra: Any
) -> AsyncIterator[tuple[BotService, ConsoleChat]]:
    """``running_bot`` with the DingTalk adapter on, pointed at a fake DingTalk, once its stream is connected."""
    async with running_bot(
        state_dir,
        config,
        dingtalk_client_id=dingtalk.client_id,
        dingtalk_client_secret=dingtalk.client_secret,
        dingtalk_openapi_endpoint=dingtalk.url,
        dingtalk_oapi_endpoint=dingtalk.url,
        **extra,
    ) as running:
        await dingtalk.wait_connected()
        yield running


async def wait_job(service: BotService, job_id: str, done: Callable[[Job], bool], timeout: float = 120) -> Job:
    deadline = time.monotonic() + timeout
    job = None
    while time.monotonic() < deadline:
        try:
            job = await service.bot.store.get(job_id)
        except StoreUnavailable:  # a failover under way: the wait outlasts it
            await asyncio.sleep(0.05)
            continue
        if job is not None and done(job):
            return job
        await asyncio.sleep(0.05)
    history = await service.bot.store.history(job_id) if job else []
    raise AssertionError(f"{job_id} stuck in {job.state if job else None}: {json.dumps(history[-6:], default=str)}")


async def start_job(service: BotService, user: str, text: str) -> str:
    reply = await service.bot.command(user, CHANNEL, text)
    assert reply.startswith("Starting ft-"), reply
    return reply.split()[1].rstrip(":")


def python() -> str:
    return sys.executable


async def drained(bus: Bus) -> bool:
    """Every entry of ``bus``'s stream so far (every partition's) was read by its group and acknowledged (handled
    or dropped).

    A handler acknowledges an entry once it is done with it, retries included, so after this nothing more
    comes of those entries: the condition to wait on instead of "a while with nothing new"."""
    if isinstance(bus, BusSet):
        return all([await drained(one) for one in bus.buses])
    last = await bus.redis.xrevrange(bus.stream, count=1)
    groups = {str(group["name"]): group for group in await bus.redis.xinfo_groups(bus.stream)}
    group = groups.get(bus.group)
    if group is None:
        return False
    return int(group["pending"]) == 0 and (not last or str(group["last-delivered-id"]) == str(last[0][0]))


async def chat_drained(service: BotService) -> bool:
    """Every note on the chat stream was read and acknowledged by the chat outbox (posted, or given up on)."""
    store = service.bot.store
    for stream in store.keys.streams("chat"):
        groups = await store.redis.xinfo_groups(stream)
        if not any(group["name"] == "chat" and group["pending"] == 0 and group["lag"] == 0 for group in groups):
            return False
    return True


async def settled(service: BotService) -> bool:
    """The bus drained, then the chat outbox: every event so far handled and every note it made delivered."""
    return await drained(service.bus) and await chat_drained(service)


async def eventually(check: Callable[[], Awaitable[bool]], timeout: float = 60) -> None:
    """Poll ``check`` until it holds (a generous ``timeout`` only turns a hang into a failure)."""
    deadline = time.monotonic() + timeout
    while not await check():
        assert time.monotonic() < deadline, f"{getattr(check, '__name__', check)} never held"
        await asyncio.sleep(0.05)

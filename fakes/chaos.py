"""Kill rounds against two bot replicas: what ``tests/test_chaos.py`` runs a few of and ``bench/chaos.py`` many.

The cluster is made of real parts: a Valkey server of its own, two ``finetune-bot serve`` processes (separate state
directories, one shared checkpoint directory, Slack in HTTP mode against :class:`fakes.fake_slack.FakeSlack`), the
local cloud's instances as processes of their own with real runners. A round starts a job from a slash command
sent to either replica, waits for it to train, asks for an interrupt test, and SIGKILLs one replica (chosen by
the seeded generator) at a random moment of the interrupt test, or (``mid_effect``) whichever replica is carrying out a
cloud effect of the interrupt test (the relaunch, mostly) at that moment, then starts it again. Then it checks:

- the job finished (else it is *stuck*);
- every note the job should have is posted, and none twice (*missing*, *duplicates*, from Slack's own record);
- every report the runners sent was taken in (its ``in:`` dedup key is in Redis: else *lost*), nothing parked;
- *takeover*: seconds from the kill until no message is held by the dead replica in any consumer group.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import redis.asyncio as aioredis
import yaml

from bot.cloud.local.provider import LocalCloud
from bot.keys import DEFAULT_KEYS
from bot.redis_server import connect
from bot.store import JobStore
from fakes.bot_harness import INTERRUPTIBLE, quick_recipe
from fakes.fake_slack import APP_TOKEN, BOT_TOKEN, SIGNING_SECRET, FakeSlack, form_body, signed_headers, slash_command
from fakes.restartable_valkey import RestartableValkey
from handlers.jobs import JobState
from handlers.messages import report_received
from handlers.reports import parse_report

CHANNEL = "C0CHAOS"
ALERTS = "C0ALERTS"
UNTHROTTLED = {"commands_per_minute": 10_000, "starts_per_minute": 10_000}
REPORT_SECRET = "chaos-report-secret"
GROUPS = ((DEFAULT_KEYS.events, "bot"), (DEFAULT_KEYS.chat, "chat"), (DEFAULT_KEYS.cloud, "cloud"))
# What an interrupt-tested job's Slack thread says, each exactly once (and the alert channel: the warning, once).
THREAD_NOTES = (
    "Interrupt test on",
    "spot interruption notice posted on",
    "Spot interruption warning",
    "💾",  # the checkpoint of the interruption (saved in time, or not)
    "Resumed on attempt 2",
    "finished",
)
_ = APP_TOKEN  # Socket Mode is not used here: HTTP mode, so a killed replica drops its connections only


@dataclass
class RoundResult:
    job_id: str
    victim: str
    kill_after: float
    finished: bool = False
    missing: list[str] = field(default_factory=list)
    duplicates: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    parked: int = 0
    held: int = 0  # messages the dead replica held when it died
    takeover: float | None = None  # seconds until another consumer had them all (None: it held nothing, or never)
    thread: list[str] = field(default_factory=list)  # what the job's thread said, kept where a note was off

    @property
    def ok(self) -> bool:
        taken_over = self.takeover is not None or not self.held
        return taken_over and self.finished and not (self.missing or self.duplicates or self.lost or self.parked)


class Replica:
    """One ``finetune-bot serve`` process."""

    def __init__(self, name: str, root: Path, env: dict[str, str]) -> None:
        self.name = name
        self.state_dir = root / name
        self.env = {**env, "FINETUNE_STATE_DIR": str(self.state_dir)}
        self.process: asyncio.subprocess.Process | None = None
        self.port = 0
        self.starts = 0

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    async def start(self, timeout: float = 90.0) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.starts += 1
        log = (self.state_dir / f"bot-{self.starts}.log").open("ab")
        self.process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "bot.cli",
            "serve",
            env=self.env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=log,
        )
        assert self.process.stdout is not None
        line = await asyncio.wait_for(self.process.stdout.readline(), timeout)
        if b"serving on port" not in line:
            raise RuntimeError(f"replica {self.name} did not start: {line!r} (see {log.name})")
        self.port = int(line.split()[-1])

    def kill(self) -> None:
        if self.process is not None and self.process.returncode is None:
            os.kill(self.process.pid, signal.SIGKILL)

    async def wait(self) -> None:
        if self.process is not None:
            await self.process.wait()

    async def stop(self) -> None:
        if self.process is None or self.process.returncode is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(self.process.wait(), 60)
        except TimeoutError:
            self.kill()
            await self.process.wait()


class Cluster:
    def __init__(self, root: Path, grace_seconds: float = 8.0) -> None:
        self.root = root
        self.grace_seconds = grace_seconds
        self.valkey = RestartableValkey(root / "redis")
        self.slack = FakeSlack()
        self.replicas: dict[str, Replica] = {}
        self.redis: aioredis.Redis | None = None
        self._http: aiohttp.ClientSession | None = None

    @property
    def store(self) -> JobStore:
        assert self.redis is not None
        return JobStore(self.redis, DEFAULT_KEYS)

    async def __aenter__(self) -> Cluster:
        await self.valkey.start()
        await self.slack.start()
        self.redis = connect(self.valkey.url)
        self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30))
        config = self.root / "bot.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "recipes": [quick_recipe("interruptible", INTERRUPTIBLE)],
                    "slack": {"alert_channel": ALERTS},
                    "policy": {"rate": UNTHROTTLED},  # the rounds measure recovery, not the per-user rate
                }
            )
        )
        env = {
            **os.environ,
            "REDIS_URL": self.valkey.url,
            "FINETUNE_HTTP_PORT": "0",
            "FINETUNE_CONFIG": str(config),
            "FINETUNE_REPORT_SECRET": REPORT_SECRET,
            "FINETUNE_LOCAL_GRACE_SECONDS": str(self.grace_seconds),
            "FINETUNE_LOCAL_CHECKPOINTS": (self.root / "bucket").resolve().as_uri() + "/",
            "SLACK_BOT_TOKEN": BOT_TOKEN,
            "SLACK_SIGNING_SECRET": SIGNING_SECRET,
            "SLACK_API_URL": self.slack.api_url,
            "FINETUNE_LOG_LEVEL": "INFO",
        }
        env.pop("SLACK_APP_TOKEN", None)
        self.replicas = {name: Replica(name, self.root, env) for name in ("a", "b")}
        await asyncio.gather(*(replica.start() for replica in self.replicas.values()))
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.gather(*(replica.stop() for replica in self.replicas.values()), return_exceptions=True)
        if self.redis is not None:
            cloud = LocalCloud(self.root, self.redis, self.valkey.url)
            with contextlib.suppress(Exception):
                await cloud.terminate_all()
            await cloud.close()
            await self.redis.aclose()
        if self._http is not None:
            await self._http.close()
        await self.slack.close()
        await self.valkey.stop()

    # -- driving it -----------------------------------------------------------------------------------------

    async def command(self, replica: Replica, text: str) -> str:
        """A signed slash command to one replica; its answer (the ephemeral one, when it came later)."""
        assert self._http is not None
        before = len(self.slack.ephemeral)
        body = form_body(slash_command(text, channel=CHANNEL))
        url = f"http://127.0.0.1:{replica.port}/slack/events"
        async with self._http.post(url, data=body, headers=signed_headers(body)) as response:
            answer = await response.text()
        with contextlib.suppress(ValueError, TypeError):
            answer = str(json.loads(answer)["text"])
        if "Working on it" not in answer:
            return answer
        late = await self.slack.wait_for(lambda: self.slack.ephemeral[before:], timeout=60)
        return str(late[0]["text"])

    async def job(self, job_id: str, done: Any, what: str, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):  # Redis is ours and stays up; a read may still time out
                job = await self.store.get(job_id)
                if job is not None and done(job):
                    return True
            await asyncio.sleep(0.1)
        return False

    async def held_by(self, pid: int, groups: tuple[tuple[str, str], ...] = GROUPS) -> int:
        """How many messages consumers of process ``pid`` hold, over ``groups`` (every consumer group)."""
        assert self.redis is not None
        held = 0
        for stream, group in groups:
            with contextlib.suppress(Exception):
                for consumer in await self.redis.xinfo_consumers(stream, group):
                    if f"-{pid}-" in str(consumer["name"]):
                        held += int(consumer["pending"])
        return held

    async def round(
        self, rng: random.Random, victim: str | None = None, mid_effect: bool = False, kill_window: float = 8.0
    ) -> RoundResult:
        """One kill round; ``victim`` is the replica to kill (else the generator picks one)."""
        names = sorted(self.replicas)
        start = await self.command(self.replicas[rng.choice(names)], "start interruptible")
        if "Starting " not in start:
            raise RuntimeError(f"start refused: {start}")
        job_id = start.split("Starting ", 1)[1].split(":", 1)[0]
        result = RoundResult(job_id, victim=victim or rng.choice(names), kill_after=rng.uniform(0.0, kill_window))
        if not await self.job(job_id, lambda j: j.state is JobState.RUNNING and (j.step or 0) >= 3, "running", 120):
            return result
        asked = await self.command(self.replicas[rng.choice(names)], f"interrupt-test {job_id}")
        if not asked.startswith("OK"):
            raise RuntimeError(f"interrupt test refused: {asked}")

        if mid_effect:
            result.victim = await self._carrying_out_an_effect(timeout=kill_window * 2) or result.victim
            result.kill_after = -1.0
        else:
            await asyncio.sleep(result.kill_after)
        dying = self.replicas[result.victim]
        dead_pid = dying.pid
        dying.kill()
        killed_at = time.monotonic()
        await dying.wait()
        held = result.held = await self.held_by(dead_pid)
        restart = asyncio.create_task(dying.start())
        while held and time.monotonic() - killed_at < 120:
            await asyncio.sleep(0.1)
            held = await self.held_by(dead_pid)
            if not held:
                result.takeover = time.monotonic() - killed_at
        await restart

        result.finished = await self.job(job_id, lambda j: j.state is JobState.SUCCEEDED, "finished", 240)
        if result.finished:
            await self._drained(timeout=60)
        self._check_notes(result)
        await self._check_reports(result)
        return result

    async def _carrying_out_an_effect(self, timeout: float) -> str | None:
        """The replica that holds a cloud effect as soon as one does (None if none did within ``timeout``)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, replica in self.replicas.items():
                if await self.held_by(replica.pid, GROUPS[2:]):
                    return name
            await asyncio.sleep(0.01)
        return None

    async def _drained(self, timeout: float) -> None:
        """Every queue read and acknowledged (what the round's last change put out has been handled)."""
        assert self.redis is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                groups = [await self.redis.xinfo_groups(stream) for stream, _group in GROUPS]
                if all(g["pending"] == 0 and g["lag"] == 0 for found in groups for g in found):
                    return
            await asyncio.sleep(0.1)

    def _check_notes(self, result: RoundResult) -> None:
        cards = [
            message
            for message in self.slack.channel_messages(CHANNEL)
            if message.blocks and message.blocks[0].get("text", {}).get("text", "").startswith(result.job_id)
        ]
        if len(cards) != 1:
            (result.duplicates if cards else result.missing).append(f"{len(cards)} cards")
        thread = [m.text for m in self.slack.replies(CHANNEL, cards[0].ts)] if cards else []
        alerts = [m.text for m in self.slack.channel_messages(ALERTS) if result.job_id in m.text]
        for said, count in Counter(thread + alerts).items():
            if count > 1:
                result.duplicates.append(f"{count}x {said[:70]}")
        expected = [(words, thread) for words in THREAD_NOTES] + [("Spot interruption warning", alerts)]
        for words, where in expected:
            count = sum(words in said for said in where)
            if count == 0:
                result.missing.append(words)
            elif count > 1 and not any(words in duplicate for duplicate in result.duplicates):
                result.duplicates.append(f"{count}x {words}")
        if result.missing or result.duplicates:
            result.thread = [said[:120] for said in thread]  # a failed round says what was posted instead

    async def _check_reports(self, result: RoundResult) -> None:
        assert self.redis is not None
        ids: list[str] = []
        for replica in self.replicas.values():
            for home in (replica.state_dir / "instances").glob("*"):
                config = home / "instance.json"
                if not config.exists() or json.loads(config.read_text()).get("job_id") != result.job_id:
                    continue
                log = home / "runner.log"
                if not log.exists():  # an instance still starting: its runner has sent nothing yet
                    continue
                for line in log.read_text(errors="replace").splitlines():
                    if " report {" in line:  # the bus id the bot gives it (its namespace: job, attempt)
                        ids.append(report_received(parse_report(line.split(" report ", 1)[1])).id)
        for report_id in ids:
            if not await self.redis.exists(DEFAULT_KEYS.dedup(DEFAULT_KEYS.input_seen(report_id))):
                result.lost.append(report_id)
        for stream, _group in GROUPS:
            result.parked += int(await self.redis.xlen(DEFAULT_KEYS.parked(stream)))

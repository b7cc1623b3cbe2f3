"""Events through the bus, the handlers and the store to a rendered chat message, on the embedded server.

Runner progress reports for a set of running jobs go onto the real events stream and one bot replica consumes
them as the service does: each is parsed, fenced and decided, the reports of one job read together applied in one
atomic write (job + history + dedup, and each card note straight onto the chat stream), and the replica's chat
outbox delivers the notes to a platform that renders every card it is handed (a card note followed at once by
another of its job is superseded: the card shows the job as stored). Two measurements, each on its own set of jobs:

- throughput and CPU: a backlog of ``--events`` reports is put on the stream first, then the replica starts and
  the time until every report *and* its note is acknowledged (on the events and the chat streams) gives events per
  second, and the bot process's CPU time over the same span divided by the events gives its CPU per event (the
  figure that stays put on a shared machine: events per second fall with the load, CPU per event hardly does).
  ``--repeat`` runs it that many times, each on fresh jobs; every run is printed with the median, and the load
  averages (as ``uptime`` says them) before and after;
- latency: reports are published at a steady pace below capacity (``--load`` times the measured throughput, or
  ``--rate``) for ``--seconds``, each at its own due time; a report's latency runs from that time to the first
  rendered card that shows its step. A burst would only measure queueing, so this phase never makes one. The
  publisher runs in the bot's process, as the HTTP endpoint for runner reports does.

    python bench/bus_throughput.py [--events 5000] [--repeat 3] [--jobs 20] [--load 0.5 | --rate N] [--seconds 10]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bot.bus import EventBus, encode_event
from bot.chat.delivery import Platform
from bot.chat.outbox import ChatOutbox
from bot.chat.render import card_text
from bot.core import Bot
from bot.keys import DEFAULT_KEYS
from bot.queues import EVENT_FIELD
from bot.redis_server import RedisHandle
from bot.store import JobStore
from handlers.clock import utcnow
from handlers.decide import decide, new_job
from handlers.jobs import ChatRef, Job
from handlers.messages import Launched, Notify, ReportReceived, dump_message
from handlers.policy_config import PolicyConfig
from handlers.recipes import BUILT_IN
from handlers.reports import Progress, Started


class TimingChat:
    """A platform's deliverer that renders every card, and notes when each job's step was first shown."""

    def __init__(self) -> None:
        self.shown: dict[tuple[str, int], float] = {}
        self.last_step: dict[str, int] = {}
        self.cards = 0

    async def deliver(self, job: Job, note: Notify) -> None:
        card_text(job, utcnow())
        self.cards += 1
        if note.channel == "card" and job.step is not None:
            now = time.perf_counter()
            for step in range(self.last_step.get(job.id, 0) + 1, job.step + 1):
                self.shown[(job.id, step)] = now  # a card showing step N also shows every step before it
            self.last_step[job.id] = max(job.step, self.last_step.get(job.id, 0))


class NoCloud:
    name = "local"
    notice = "none"
    notice_seconds = 120.0


async def make_jobs(store: JobStore, prefix: str, count: int) -> list[str]:
    now = utcnow()
    jobs = []
    for index in range(count):
        chat = ChatRef(platform="bench", channel="bench")
        change = new_job(f"ft-{prefix}{index:03d}", "tiny", {}, "console:bench", chat, now)
        launched = decide(change.job, Launched(job_id=change.job.id, attempt=1, instance_id=f"i-{prefix}{index}"), now)
        assert launched is not None
        started = decide(launched.job, ReportReceived(report=Started(job_id=launched.job.id, attempt=1)), now)
        assert started is not None
        job = started.job
        await store.create(job, {"event": "bench"})
        jobs.append(job.id)
    return jobs


def reports(jobs: list[str], count: int) -> list[tuple[str, int, dict[str, Any]]]:
    """``count`` progress reports spread round-robin over ``jobs``, steps 1, 2, … per job."""
    result = []
    for number in range(count):
        job_id = jobs[number % len(jobs)]
        step = number // len(jobs) + 1
        report = Progress(job_id=job_id, attempt=1, step=step, total_steps=count)
        result.append((job_id, step, dump_message(ReportReceived(report=report))))
    return result


async def until(condition: Any, timeout: float = 600.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError("the replica did not keep up: timed out")
        await asyncio.sleep(0.002)


async def server_cpu(redis: aioredis.Redis) -> float:
    info = await redis.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


async def throughput(
    redis: aioredis.Redis, bus: EventBus, bot: Bot, outbox: ChatOutbox, jobs: list[str], events: int
) -> Throughput:
    """Events per second through a backlog of ``events`` reports (each with its card note delivered)."""
    async with redis.pipeline(transaction=False) as pipe:
        for _job, _step, message in reports(jobs, events):
            pipe.xadd(bus.stream, {EVENT_FIELD: encode_event(message)[EVENT_FIELD]})
        await pipe.execute()
    stop = asyncio.Event()
    before, notes = bus.handled, outbox.bus.handled
    cpu, valkey = time.process_time(), await server_cpu(redis)
    started = time.perf_counter()
    consumers = asyncio.gather(
        bus.run(bot.handle, stop, bot.handle_many), outbox.bus.run(outbox.handle, stop, outbox.handle_many)
    )
    # every report, and the card note it put on the chat stream
    await until(lambda: bus.handled - before >= events and outbox.bus.handled - notes >= events)
    elapsed = time.perf_counter() - started
    cpu, valkey = time.process_time() - cpu, await server_cpu(redis) - valkey
    stop.set()
    await consumers
    return Throughput(events / elapsed, cpu / events, valkey / events)


@dataclass
class Throughput:
    rate: float
    bot_cpu: float  # seconds of the bot process's CPU per event
    valkey_cpu: float


async def paced(
    publisher: aioredis.Redis,
    bus: EventBus,
    bot: Bot,
    outbox: ChatOutbox,
    chat: TimingChat,
    jobs: list[str],
    rate: float,
    seconds: float,
) -> tuple[list[float], float]:
    """Publish at ``rate`` per second for ``seconds``; the publish → card latencies and the achieved rate.

    Reports come from many runners at once: one never waits for another's XADD. Whatever fell due while an XADD
    was on its way goes in the next one (one pipeline), and latency counts from each report's due time, so a
    report published late counts as late.
    """
    messages = reports(jobs, max(int(rate * seconds), 1))
    stop = asyncio.Event()
    before, notes = bus.handled, outbox.bus.handled
    consumers = asyncio.gather(
        bus.run(bot.handle, stop, bot.handle_many), outbox.bus.run(outbox.handle, stop, outbox.handle_many)
    )
    await asyncio.sleep(0.2)  # the consumers are reading
    due: dict[tuple[str, int], float] = {}
    start = time.perf_counter()
    sent = 0
    while sent < len(messages):
        if (delay := start + sent / rate - time.perf_counter()) > 0:
            await asyncio.sleep(delay)
        now = time.perf_counter()
        batch = []
        while sent < len(messages) and start + sent / rate <= now:
            job_id, step, message = messages[sent]
            due[(job_id, step)] = start + sent / rate
            batch.append(message)
            sent += 1
        async with publisher.pipeline(transaction=False) as pipe:
            for message in batch:
                pipe.xadd(bus.stream, {EVENT_FIELD: encode_event(message)[EVENT_FIELD]})
            await pipe.execute()
    achieved = len(messages) / (time.perf_counter() - start) if len(messages) > 1 else rate
    await until(lambda: bus.handled - before >= len(messages) and outbox.bus.handled - notes >= len(messages))
    stop.set()
    await consumers
    latencies = sorted(chat.shown[key] - at for key, at in due.items())
    return latencies, achieved


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=5000, help="backlog size for the throughput run")
    parser.add_argument("--repeat", type=int, default=3, help="throughput runs, each on fresh jobs (median shown)")
    parser.add_argument("--jobs", type=int, default=20, help="running jobs the reports are spread over")
    parser.add_argument("--load", type=float, default=0.5, help="paced rate as a fraction of measured throughput")
    parser.add_argument("--rate", type=float, default=None, help="paced rate in events/s (overrides --load)")
    parser.add_argument("--seconds", type=float, default=10.0, help="how long the paced run publishes")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        redis = RedisHandle(data_dir=Path(tmp) / "redis")
        await redis.start()
        try:
            store = JobStore(redis.client, DEFAULT_KEYS)
            bus = EventBus(redis.new_client(), stream=DEFAULT_KEYS.events, consumer="bench")
            await bus.ensure_group()
            publisher = redis.new_client()  # like the HTTP endpoint for runner reports
            chat = TimingChat()
            platform = Platform(chat, coalesce_cards=False)  # every card handed over is rendered (no timed refresh)
            outbox = ChatOutbox(redis.new_client(), store, {"bench": platform}, consumer="bench")
            await outbox.bus.ensure_group()
            bot = Bot(store, NoCloud(), PolicyConfig(), BUILT_IN)  # type: ignore[arg-type]

            gc.freeze()  # as the bot does once it is up (bot/service.py): what exists now stays out of full passes
            load = os.getloadavg()
            runs = []
            for n in range(max(args.repeat, 1)):
                jobs = await make_jobs(store, f"tput{n}x", args.jobs)
                runs.append(await throughput(redis.client, bus, bot, outbox, jobs, args.events))
            after = os.getloadavg()
            rate = statistics.median(run.rate for run in runs)
            target = args.rate if args.rate is not None else rate * args.load
            latencies, achieved = await paced(
                publisher, bus, bot, outbox, chat, await make_jobs(store, "lat", args.jobs), target, args.seconds
            )
            q = statistics.quantiles(latencies, n=100, method="inclusive")
            cores = len(os.sched_getaffinity(0))
            print(f"progress reports for {args.jobs} jobs: events stream → handlers → store → chat stream → card")
            print(f"(one replica, embedded Valkey, {cores} cores; load average {_load(load)} before,", end=" ")
            print(f"{_load(after)} after;")
            print(" targets: at most 300 µs of the bot's CPU per event, 2,500 events/s, p99 < 50 ms)")
            for number, run in enumerate(runs, 1):
                print(
                    f"  run {number}, backlog of {args.events}:  bot CPU {run.bot_cpu * 1e6:5.0f} µs/event "
                    f"(Valkey {run.valkey_cpu * 1e6:4.0f} µs)   {run.rate:6.0f} events/s"
                )
            bot_cpu = statistics.median(run.bot_cpu for run in runs)
            valkey_cpu = statistics.median(run.valkey_cpu for run in runs)
            print(
                f"  median:                      bot CPU {bot_cpu * 1e6:5.0f} µs/event "
                f"(Valkey {valkey_cpu * 1e6:4.0f} µs)   {rate:6.0f} events/s"
            )
            print(
                f"  latency at {achieved:.0f} events/s ({achieved / rate:.0%} of that), {len(latencies)} events, "
                f"publish → card rendered:"
            )
            print(f"    p50 {q[49] * 1000:6.1f} ms   p99 {q[98] * 1000:6.1f} ms   max {latencies[-1] * 1000:6.1f} ms")
            failed, parked = bus.failed + outbox.bus.failed, bus.parked + outbox.bus.parked
            if failed or parked:
                print(f"  !! {failed} handler failures, {parked} parked")
            await bus.redis.aclose()
            await outbox.redis.aclose()
            await publisher.aclose()
        finally:
            await redis.close()


def _load(averages: tuple[float, float, float]) -> str:
    return ", ".join(f"{value:.2f}" for value in averages)


if __name__ == "__main__":
    asyncio.run(main())

"""Slack in HTTP mode, measured end to end: the real BotService (embedded Valkey, local cloud with real runner
subprocesses) serving signed requests on /slack/events, and delivering through the durable outbox to the local
fake Slack of fakes/fake_slack.py over real HTTP. The fake runs in the bot's process and event loop, so its CPU
counts against the bot's. Three measurements:

- slash commands: ``--starts`` ``/finetune start`` (a trainer that only sleeps), then ``--requests``
  ``/finetune status <job>`` and ``/finetune list`` alternately, one after another; the time from sending the
  signed POST to its HTTP response (Slack gives up after 3 s; the bot acks "working on it" after 2 s);
- card coalescing: ``--reports`` progress reports for one running job published on the bus as fast as one
  caller can; ``chat.update`` calls, and the time from the last report to the card showing its step;
- an outage: the fake answers 500 for ``--outage`` seconds while 20 thread notes are produced; the time from
  its recovery to the last note delivered, and whether each note arrived exactly once.

    PYTHONPATH=. python bench/slack_latency.py [--requests 200] [--starts N/10] [--reports 500] [--outage 5]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bot.service import BotService
from fakes.bot_harness import SLEEPS, quick_recipe, running_bot, slack_settings, wait_job, write_config
from fakes.fake_slack import Call, FakeSlack, form_body, signed_headers, slash_command
from fakes.notes import notify
from handlers.jobs import Job, JobState
from handlers.messages import ReportReceived, dump_message
from handlers.reports import Progress

CHANNEL = "C0JOBS"
NOTES = 20
WORKING = "Working on it"


def figures(seconds: list[float]) -> str:
    ms = sorted(value * 1000 for value in seconds)
    q = statistics.quantiles(ms, n=100, method="inclusive") if len(ms) > 1 else ms * 99
    return f"p50 {q[49]:6.1f} ms   p95 {q[94]:6.1f} ms   p99 {q[98]:6.1f} ms   max {ms[-1]:6.1f} ms"


async def until(condition: Callable[[], Any], timeout: float = 60.0, poll: float = 0.005) -> Any:
    deadline = time.monotonic() + timeout
    while not (result := condition()):
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {getattr(condition, '__name__', 'a condition')}")
        await asyncio.sleep(poll)
    return result


class Stalls:
    """The longest time the event loop could not run a 5 ms timer: a blocking call, a full GC, CPU starvation."""

    def __init__(self) -> None:
        self.worst = 0.0
        self._task = asyncio.create_task(self._watch())

    async def _watch(self) -> None:
        while True:
            before = time.perf_counter()
            await asyncio.sleep(0.005)
            self.worst = max(self.worst, time.perf_counter() - before - 0.005)

    def close(self) -> float:
        self._task.cancel()
        return self.worst


class Slash:
    """Signed slash commands to the bot's /slack/events over one keep-alive session, each one timed."""

    def __init__(self, http: aiohttp.ClientSession, service: BotService) -> None:
        self.http = http
        self.url = f"http://127.0.0.1:{service.port}/slack/events"
        self.deferred = 0  # answers that did not fit the 2 s budget ("working on it", the answer followed later)

    async def __call__(self, text: str) -> tuple[float, str]:
        body = form_body(slash_command(text, channel=CHANNEL))
        headers = signed_headers(body)
        started = time.perf_counter()
        async with self.http.post(self.url, data=body, headers=headers) as response:
            reply = await response.text()
        elapsed = time.perf_counter() - started
        if response.status != 200:
            raise RuntimeError(f"{text!r}: HTTP {response.status} {reply[:200]}")
        self.deferred += WORKING in reply
        return elapsed, reply


def job_id_of(reply: str) -> str:
    if "Starting ft-" not in reply:
        raise RuntimeError(f"start refused: {reply[:200]}")
    return reply.split("Starting ", 1)[1].split(":", 1)[0]


def card_ts(slack: FakeSlack, job_id: str) -> str:
    for message in slack.channel_messages(CHANNEL):
        if message.blocks and str(message.blocks[0].get("text", {}).get("text", "")).startswith(job_id):
            return message.ts
    return ""


async def commands(service: BotService, slash: Slash, requests: int, starts: int) -> list[Job]:
    """Section 1; returns the started jobs, running."""
    started: list[float] = []
    jobs: list[str] = []
    stalls = Stalls()
    for _ in range(starts):
        elapsed, reply = await slash("start sleepy")
        started.append(elapsed)
        jobs.append(job_id_of(reply))
    starting_stall = stalls.close()
    running = [await wait_job(service, job, lambda j: j.state is JobState.RUNNING, timeout=90) for job in jobs]
    stalls = Stalls()
    timings: dict[str, list[float]] = {"status <job>": [], "list": []}
    for number in range(requests):
        kind = "list" if number % 2 else "status <job>"
        elapsed, _reply = await slash("list" if kind == "list" else f"status {jobs[number % len(jobs)]}")
        timings[kind].append(elapsed)
    reading_stall = stalls.close()
    print(f"1. slash command → HTTP response (signed POST /slack/events; Slack's limit 3 s), {len(jobs)} jobs exist")
    print(f"   status + list, {requests}:  {figures(timings['status <job>'] + timings['list'])}")
    for kind, values in timings.items():
        print(f"     {kind:<13} {len(values):4d}:  {figures(values)}")
    print(f"     longest event-loop stall meanwhile: {reading_stall * 1000:.0f} ms")
    print(f"   start <recipe>, {starts}:    {figures(started)}")
    print(f"     back to back, each launching a runner subprocess; longest loop stall {starting_stall * 1000:.0f} ms")
    print(f"   answers deferred past the 2 s budget: {slash.deferred}")
    return running


async def coalescing(service: BotService, slack: FakeSlack, job: Job, reports: int) -> None:
    """Section 2: a burst of progress reports for one job, against the card edits it costs."""
    ts = await until(lambda: card_ts(slack, job.id))
    await asyncio.sleep(2.5)  # the card has caught up with the job's start: edits from here on are ours
    edits_before, first = len(slack.called("chat.update")), time.monotonic()
    for step in range(1, reports + 1):
        report = Progress(job_id=job.id, attempt=job.attempt, step=step, total_steps=reports, loss=1 / step)
        await service.bus.publish(dump_message(ReportReceived(report=report)))
    last = time.monotonic()
    target = f"{reports}/{reports}"

    def shown() -> Call | None:
        edits = slack.called("chat.update")[edits_before:]
        return next((c for c in edits if c.args.get("ts") == ts and target in str(c.args.get("blocks"))), None)

    showing: Call = await until(shown, poll=0.01)
    await asyncio.sleep(3.0)  # past one more coalescing interval: count any edit still owed
    edits = [c for c in slack.called("chat.update")[edits_before:] if c.args.get("ts") == ts]
    print(f"2. card coalescing: {reports} progress reports for one running job, published one after another")
    print(f"   published in {last - first:.2f} s ({reports / (last - first):.0f}/s)")
    print(f"   chat.update calls: {len(edits)}   reports per edit: {reports / max(len(edits), 1):.0f}")
    print(f"   last report → card shows step {target}: {(showing.at - last) * 1000:.0f} ms")


async def outage(service: BotService, slack: FakeSlack, job: Job, seconds: float) -> None:
    """Section 3: thread notes produced while Slack answers 500; each must arrive once after it recovers."""
    assert service.outbox is not None
    ts = card_ts(slack, job.id)
    marker = "Early checkpoint at step"

    def posted() -> list[Call]:
        return [
            c
            for c in slack.called("chat.postMessage")
            if c.args.get("thread_ts") == ts and marker in str(c.args.get("text"))
        ]

    before = len(slack.calls)
    slack.go_down()
    down_at = time.monotonic()
    for number in range(1, NOTES + 1):
        note = notify(job.id, "thread", "rebalance-checkpoint", **{"step": number})
        await service.outbox.notify(job, note)
        await asyncio.sleep(max(0.0, down_at + number * seconds / (NOTES + 1) - time.monotonic()))
    await asyncio.sleep(max(0.0, down_at + seconds - time.monotonic()))
    refused = sum(1 for c in slack.calls[before:] if c.status == 500)
    slack.come_back()
    back = time.monotonic()
    await until(lambda: len({str(c.args.get("text")) for c in posted()}) >= NOTES, timeout=90, poll=0.01)
    first, done = min(c.at for c in posted()), max(c.at for c in posted())
    await asyncio.sleep(3.0)  # any duplicate would show up by now
    counts = Counter(str(c.args.get("text")) for c in posted())
    print(f"3. delivery through an outage: the fake answers 500 for {seconds:.0f} s while {NOTES} thread notes come")
    print(f"   calls refused while down: {refused}   (outbox backoff doubles from 0.5 s up to 10 s, shared gate)")
    print(f"   recovery → first note delivered: {(first - back) * 1000:.0f} ms, last: {(done - back) * 1000:.0f} ms")
    print(
        f"   produced {NOTES}, delivered {len(counts)} distinct, {sum(counts.values())} posts: "
        f"lost {NOTES - len(counts)}, duplicated {sum(n - 1 for n in counts.values())}; "
        f"outbox dropped {service.outbox.dropped}"
    )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=200, help="status/list slash commands")
    parser.add_argument("--starts", type=int, default=None, help="start slash commands (default: requests / 10)")
    parser.add_argument("--reports", type=int, default=500, help="progress reports in the burst")
    parser.add_argument("--outage", type=float, default=5.0, help="seconds the fake Slack answers 500")
    args = parser.parse_args()
    starts = max(args.starts if args.starts is not None else args.requests // 10, 1)
    logging.basicConfig(level=logging.ERROR)  # the outage's retry warnings are expected; errors still show
    load, cores = os.getloadavg()[0], len(os.sched_getaffinity(0))
    print(f"Slack HTTP mode against a local fake Slack; {cores} cores, load average {load:.2f} at the start")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        unthrottled = {"commands_per_minute": 10_000, "starts_per_minute": 10_000}  # latency, not the per-user rate
        policy = {"max_concurrent_nodes": starts + 5, "rate": unthrottled}  # one person starts them all
        config = write_config(root / "bot.yaml", recipes=[quick_recipe("sleepy", SLEEPS)], policy=policy)
        async with (
            FakeSlack() as slack,
            running_bot(root / "state", config, grace=5.0, **slack_settings(slack.api_url)) as (service, _console),
            aiohttp.ClientSession() as http,
        ):
            slash = Slash(http, service)
            jobs = await commands(service, slash, args.requests, starts)
            kept, rest = jobs[0], jobs[1:]
            for job in rest:  # a quiet bot for the delivery figures: one job left running
                await slash(f"stop {job.id}")
            for job in rest:
                await wait_job(service, job.id, lambda j: j.state is JobState.STOPPED, timeout=60)
            await coalescing(service, slack, kept, args.reports)
            await outage(service, slack, kept, args.outage)
            await slash(f"stop {kept.id}")
            await wait_job(service, kept.id, lambda j: j.state is JobState.STOPPED, timeout=60)


if __name__ == "__main__":
    asyncio.run(main())

"""Events through the whole path on one Valkey primary against a three-primary cluster, with one and with three bot
replicas; then a primary killed under load, and how long the bot takes to change its jobs again.

A bot replica here is a process of its own, as in production: it consumes the events streams with the handlers
and the store, and delivers the chat notes (bench/bus_throughput.py's path: a progress report → its job's lane →
one atomic change of job, history, dedup and card note → the chat stream → a rendered card). Replicas share the
consumer groups, so they split the work. Measured per configuration:

- throughput: ``--events`` progress reports over ``--jobs`` running jobs are put on the streams (each on its
  job's partition), then the time until every report and its card note are acknowledged (every partition's
  group drained, read from Redis) gives events per second; the replicas' CPU (summed, from /proc) and every
  Valkey node's (INFO cpu) per event. ``--repeat`` runs per configuration, on fresh jobs; each and the median.
  Durability ``none`` (bench/cluster_store.py prices ``replica`` per change).
- failover (cluster, one replica): reports at a steady ``--rate`` for every job, one
  after the other per job as a runner sends them (a report refused during the outage is sent again); a primary
  that serves some jobs is SIGKILLed; its replica takes over once the cluster fails the primary
  (``cluster-node-timeout`` 2 s). Printed: when the bot changed a job of the dead primary again (after the kill),
  and whether every job ended at its last step with each card note delivered once (nothing lost, nothing twice).
  Durability ``none`` here: under ``replica`` a promoted primary has no replica of its own until the old host
  returns, and its partitions' changes wait for one (docs/production.md says so); tests/test_cluster_durability.py
  proves that nothing acknowledged is lost then.

    python bench/cluster_path.py [--jobs 32] [--events 2000] [--repeat 2] [--rate 200] [--no-failover]

One machine (2 cores here) runs the servers, the replicas and the publisher: the figures compare configurations on
it; a cluster's gain is in memory and writes spread over hosts, which one machine cannot show.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis
from redis.crc import key_slot

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bus_throughput import NoCloud, TimingChat, make_jobs, reports
from bot.bus import encode_event
from bot.bus_set import bus_for
from bot.chat.delivery import Platform
from bot.chat.outbox import ChatOutbox
from bot.core import Bot
from bot.durability import DurableWrites
from bot.errors import StoreUnavailable
from bot.keys import Keys
from bot.partitions import open_keys
from bot.queues import EVENT_FIELD
from bot.redis_server import RedisHandle
from bot.store import JobStore
from bot.supervision import Supervisor
from fakes.bot_harness import drained, eventually
from fakes.valkey_cluster import ValkeyCluster
from handlers.messages import ReportReceived, dump_message
from handlers.policy_config import PolicyConfig
from handlers.recipes import BUILT_IN
from handlers.reports import Progress

PREFIX = "finetune:"


# -- a bot replica (its own process) -------------------------------------------------------------------------


async def replica(url: str, name: str, durability: str) -> None:
    """Consume events and deliver chat notes until SIGTERM; then print the counters on one line."""
    handle = RedisHandle(url=url)
    await handle.start()
    keys = await open_keys(handle.client, PREFIX)
    store = JobStore(handle.client, keys, durability=DurableWrites(durability, 2000))  # type: ignore[arg-type]
    bus = bus_for(handle.new_client(), keys, "events", consumer=name, jobs_of_instances=store.jobs_for_instances)
    chat = TimingChat()
    outbox = ChatOutbox(handle.new_client(), store, {"bench": Platform(chat, coalesce_cards=False)}, consumer=name)
    bot = Bot(store, NoCloud(), PolicyConfig(), BUILT_IN)  # type: ignore[arg-type]
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    loops = Supervisor(stop)  # as the service runs them: a loop that dies is reported, not hidden
    await bus.ensure_group()
    await outbox.bus.ensure_group()
    print("ready", flush=True)
    await asyncio.to_thread(sys.stdin.readline)  # "go": every replica is up, and the clock starts
    loops.start(bus.run(bot.handle, stop, bot.handle_many), "bus")
    loops.start(outbox.bus.run(outbox.handle, stop, outbox.handle_many), "chat-outbox")
    await stop.wait()
    await loops.wait()
    failed, parked = bus.failed + outbox.bus.failed, bus.parked + outbox.bus.parked
    notes = chat.cards + outbox.coalesced  # a card note superseded by the next of its job, read with it, is drawn once
    print(f"counters {bus.handled} {failed} {parked} {notes} {loops.cause or '-'}", flush=True)
    await handle.close()


# -- the parent ------------------------------------------------------------------------------------------------


@dataclass
class Replicas:
    processes: list[subprocess.Popen[str]]

    @classmethod
    def start(cls, url: str, count: int, logs: Path, durability: str = "none") -> Replicas:
        """``count`` replica processes, connected and with their groups made, not consuming yet (:meth:`go`);
        what they log goes to ``logs``/r<n>.log."""
        script = str(Path(__file__).resolve())
        processes = []
        for n in range(count):
            with (logs / f"r{n}.log").open("a") as log:
                processes.append(
                    subprocess.Popen(
                        [sys.executable, script, "--replica", url, "--name", f"r{n}", "--durability", durability],
                        stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE,
                        stderr=log,
                        text=True,
                    )
                )
        started = cls(processes)
        try:
            for number, process in enumerate(processes):
                assert process.stdout is not None
                if process.stdout.readline().strip() != "ready":
                    raise RuntimeError(f"replica r{number} did not start: see {logs / f'r{number}.log'}")
        except BaseException:
            started.kill()
            raise
        return started

    def go(self) -> None:
        for process in self.processes:
            assert process.stdin is not None
            process.stdin.write("go\n")
            process.stdin.flush()

    def cpu(self) -> float:
        """The replicas' CPU seconds so far (user + system, from /proc)."""
        return sum(_cpu_seconds(p.pid) for p in self.processes)

    def stop(self) -> list[list[str]]:
        """SIGTERM each; their counters: handled, failed, parked, card notes drawn, a loop that died (or -)."""
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        counters = []
        for process in self.processes:
            try:
                output, _ = process.communicate(timeout=60)  # closing stdin also frees one still waiting for "go"
            except subprocess.TimeoutExpired:
                process.kill()  # a replica that does not stop is a finding: no counters line, said below
                output, _ = process.communicate()
            lines = [line.split()[1:] for line in output.splitlines() if line.startswith("counters ")]
            counters.append(lines[-1] if lines else ["?"] * 4 + ["no counters: the replica died"])
        return counters

    def kill(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.kill()
                process.wait()


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


async def valkey_cpu(nodes: list[aioredis.Redis]) -> float:
    total = 0.0
    for node in nodes:
        info = await node.info("cpu")
        total += float(info["used_cpu_user"]) + float(info["used_cpu_sys"])
    return total


async def backlog(client: aioredis.Redis, keys: Keys, jobs: list[str], count: int) -> dict[str, int]:
    """``count`` progress reports on the events streams, each on its job's partition; each job's last step."""
    last: dict[str, int] = {}
    async with client.pipeline(transaction=False) as pipe:
        for job_id, step, message in reports(jobs, count):
            stream = keys.events_in(keys.partition_of(job_id))
            pipe.xadd(stream, {EVENT_FIELD: encode_event(message)[EVENT_FIELD]})
            last[job_id] = step
        await pipe.execute()
    return last


@dataclass(frozen=True, slots=True)
class Run:
    rate: float
    replica_cpu: float  # s per event, the replicas summed
    valkey_cpu: float  # s per event, every node summed


async def throughput_run(
    client: aioredis.Redis, keys: Keys, nodes: list[aioredis.Redis], store: JobStore, url: str, tag: str, o: Options
) -> Run:
    jobs = await make_jobs(store, tag, o.jobs)
    events, chat = bus_for(client, keys, "events"), bus_for(client, keys, "chat", group="chat")
    await events.ensure_group()
    await chat.ensure_group()
    last = await backlog(client, keys, jobs, o.events)
    replicas = Replicas.start(url, o.replicas, o.logs)
    try:
        cpu, valkey = replicas.cpu(), await valkey_cpu(nodes)
        started = time.perf_counter()
        replicas.go()
        await eventually(lambda: _all_drained(events, chat), timeout=900)
        elapsed = time.perf_counter() - started
        cpu, valkey = replicas.cpu() - cpu, await valkey_cpu(nodes) - valkey
    finally:
        counters = replicas.stop()
    _say_trouble(counters)
    behind = [job_id for job_id in jobs if await _step(store, job_id) != last[job_id]]
    if behind:
        print(f"    !! {len(behind)} of {len(jobs)} jobs not at their last published step (e.g. {behind[0]})")
    return Run(o.events / elapsed, cpu / o.events, valkey / o.events)


async def _all_drained(*buses: object) -> bool:
    try:
        return all([await drained(bus) for bus in buses])  # type: ignore[arg-type]
    except StoreUnavailable:
        return False


def _say_trouble(counters: list[list[str]]) -> None:
    for number, (_handled, failed, parked, _cards, died) in enumerate(counters):
        if failed not in ("0", "?") or parked not in ("0", "?") or died != "-":
            print(f"    !! replica r{number}: {failed} handler failures, {parked} parked, loop ended: {died}")


@dataclass(frozen=True, slots=True)
class Options:
    jobs: int
    events: int
    repeat: int
    replicas: int
    rate: float
    logs: Path  # where the replicas log


async def configuration(name: str, url: str, nodes: list[aioredis.Redis], options: Options) -> list[Run]:
    handle = RedisHandle(url=url)
    await handle.start()
    try:
        keys = await open_keys(handle.client, PREFIX)
        store = JobStore(handle.client, keys)
        runs = []
        for n in range(options.repeat):
            tag = f"{name[:1]}{options.replicas}r{n}x"
            runs.append(await throughput_run(handle.client, keys, nodes, store, url, tag, options))
        return runs
    finally:
        await handle.close()


def line(label: str, runs: list[Run]) -> str:
    each = "  ".join(f"{run.rate:5.0f}" for run in runs)
    rate = statistics.median(run.rate for run in runs)
    cpu = statistics.median(run.replica_cpu for run in runs) * 1e6
    valkey = statistics.median(run.valkey_cpu for run in runs) * 1e6
    return f"  {label:<38} {each} events/s (median {rate:5.0f}); bot CPU {cpu:5.0f} µs/event, Valkey {valkey:4.0f}"


# -- failover --------------------------------------------------------------------------------------------------


async def failover(cluster: ValkeyCluster, options: Options) -> None:
    handle = RedisHandle(url=cluster.url)
    await handle.start()
    client = handle.client
    replicas = Replicas([])
    try:
        keys = await open_keys(client, PREFIX)
        store = JobStore(client, keys)
        jobs = await make_jobs(store, "fo", options.jobs)
        doomed = cluster.node_of_slot(key_slot(keys.job(jobs[0]).encode()))
        on_doomed = [j for j in jobs if cluster.node_of_slot(key_slot(keys.job(j).encode())).port == doomed.port]
        replicas = Replicas.start(cluster.url, 1, options.logs)
        replicas.go()
        per_job = max(int(options.rate * 12 / options.jobs), 4)  # about twelve seconds of reports
        sent: dict[str, int] = dict.fromkeys(jobs, 0)
        killed_at: float | None = None

        async def runner(job_id: str) -> None:
            """One job's reports, one after the other; one refused during the outage is sent again."""
            pace = options.jobs / options.rate
            for step in range(1, per_job + 1):
                message = dump_message(ReportReceived(report=Progress(job_id=job_id, attempt=1, step=step)))
                fields: dict[Any, Any] = {EVENT_FIELD: encode_event(message)[EVENT_FIELD]}
                while True:
                    try:
                        await client.xadd(keys.events_in(keys.partition_of(job_id)), fields)
                        break
                    except StoreUnavailable:
                        await asyncio.sleep(0.05)
                sent[job_id] = step
                await asyncio.sleep(pace)

        async def kill_then_watch() -> float:
            nonlocal killed_at
            await asyncio.sleep(4)
            before = {j: await _step(store, j) for j in on_doomed}
            killed_at = time.perf_counter()
            cluster.kill(doomed)
            while True:  # the bot changed one of the dead primary's jobs again
                for job_id in on_doomed:
                    if await _step(store, job_id) > before[job_id]:
                        return time.perf_counter() - killed_at
                await asyncio.sleep(0.02)

        *_, seen = await asyncio.gather(*(runner(j) for j in jobs), kill_then_watch())
        events, chat = bus_for(client, keys, "events"), bus_for(client, keys, "chat", group="chat")
        await eventually(lambda: _all_drained(events, chat), timeout=900)
        finals = {j: await _step(store, j) for j in jobs}
    finally:
        counters = replicas.stop()
        await handle.close()
    lost = [j for j in jobs if finals[j] != sent[j]]
    [(handled, failed, parked, notes, died)] = counters
    expected = sum(sent.values())
    print(f"failover: primary :{doomed.port} (partitions of {len(on_doomed)} of {len(jobs)} jobs) SIGKILLed under")
    print(f"  {options.rate:.0f} reports/s; the bot changed one of its jobs again {seen:.2f} s after the kill")
    print(f"  jobs not at their last step: {len(lost)}; card notes {notes} of {expected} reports", end="")
    print(f" ({'each once' if notes == str(expected) else 'MISMATCH'}); handled {handled}, failed {failed},")
    print(f"  parked {parked}; a replica loop ended: {died}")


async def _step(store: JobStore, job_id: str) -> int:
    while True:
        try:
            job = await store.get(job_id)
            return (job.step or 0) if job is not None else 0
        except StoreUnavailable:
            await asyncio.sleep(0.02)


# -- main ------------------------------------------------------------------------------------------------------


async def main(options: argparse.Namespace) -> None:
    print(f"{len(os.sched_getaffinity(0))} cores; load average {_load(os.getloadavg())} at the start")
    print(f"{options.events} progress reports over {options.jobs} jobs, whole path to a rendered card:")
    with tempfile.TemporaryDirectory(prefix="cluster-path-") as tmp:
        base = Options(options.jobs, options.events, options.repeat, 1, options.rate, Path(tmp))
        single = RedisHandle(data_dir=Path(tmp) / "single")
        await single.start()
        try:
            for count in (1, 3):
                runs = await configuration("single", single.url, [single.client], with_replicas(base, count))
                print(line(f"one primary, {count} replica{'s' if count > 1 else ''}:", runs))
        finally:
            await single.close()
        cluster = ValkeyCluster(Path(tmp) / "cluster").start()
        nodes = [aioredis.Redis(port=node.port) for node in cluster.nodes]
        try:
            for count in (1, 3):
                runs = await configuration("cluster", cluster.url, nodes, with_replicas(base, count))
                print(line(f"3 primaries + 3 replicas, {count} replica{'s' if count > 1 else ''}:", runs))
            if options.failover:
                await failover(cluster, base)
        finally:
            for node in nodes:
                await node.aclose()
            cluster.stop()
    print(f"load average {_load(os.getloadavg())} at the end")


def _load(averages: tuple[float, float, float]) -> str:
    return ", ".join(f"{value:.2f}" for value in averages)


def with_replicas(options: Options, replicas: int) -> Options:
    return Options(options.jobs, options.events, options.repeat, replicas, options.rate, options.logs)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=32)
    parser.add_argument("--events", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--rate", type=float, default=200.0, help="reports per second in the failover phase")
    parser.add_argument("--failover", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--replica", help=argparse.SUPPRESS)  # a bot replica's own process
    parser.add_argument("--name", default="r0", help=argparse.SUPPRESS)
    parser.add_argument("--durability", default="none", help=argparse.SUPPRESS)
    args = parser.parse_args()
    asyncio.run(replica(args.replica, args.name, args.durability) if args.replica else main(args))

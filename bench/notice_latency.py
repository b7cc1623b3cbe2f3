"""Notice detection latency: from the moment IMDS starts answering with a spot notice to the runner's watcher
handing it over. Real HTTP against the local IMDSv2, the production watcher and its default poll interval.

    python bench/notice_latency.py [--trials 100] [--interval 0.5]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bot.cloud.local.metadata import LocalMetadataServer
from handlers.reports import InstanceNotice
from runner.notices.aws import AwsImdsSource
from runner.notices.watch import DEFAULT_POLL_SECONDS, watch_notices


async def one_trial(imds: LocalMetadataServer, interval: float) -> float:
    imds.interruption = None
    source = AwsImdsSource(imds.endpoint)
    notices: asyncio.Queue[InstanceNotice] = asyncio.Queue()
    watcher = asyncio.create_task(watch_notices(source, notices, lambda _: None, interval=interval))
    try:
        await asyncio.sleep(random.uniform(0.5, 0.5 + interval))  # land anywhere in the polling cycle
        posted = time.perf_counter()
        imds.interrupt(seconds=120)
        await notices.get()
        return time.perf_counter() - posted
    finally:
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
        await source.close()


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument("--interval", type=float, default=DEFAULT_POLL_SECONDS)
    args = parser.parse_args()
    imds = await LocalMetadataServer().start()
    try:
        latencies = sorted([await one_trial(imds, args.interval) for _ in range(args.trials)])
    finally:
        await imds.stop()
    p = statistics.quantiles(latencies, n=100, method="inclusive")
    print(f"notice detection latency, poll interval {args.interval:.2f}s, {args.trials} trials (real HTTP, IMDSv2)")
    print(
        f"  p50 {p[49] * 1000:7.1f} ms   p90 {p[89] * 1000:7.1f} ms   p99 {p[98] * 1000:7.1f} ms"
        f"   max {latencies[-1] * 1000:7.1f} ms   (target: p99 < 1000 ms)"
    )


if __name__ == "__main__":
    asyncio.run(main())

"""Kill rounds against two bot replicas, for a while: lost events, duplicate posts, stuck jobs, takeover seconds.

The cluster is the one ``tests/test_chaos.py`` uses (``fakes/chaos.py``): a Valkey server of its own, two
``finetune-bot serve`` processes with separate state directories, Slack in HTTP mode against a local fake, the
local cloud's instances as processes of their own with real runners. Each round starts a job from a slash command,
asks for an interrupt test and SIGKILLs a replica: at a random moment of the interrupt test (even rounds), or whichever
replica is carrying out a cloud effect of it (odd rounds: mostly the relaunch), then starts it again.

    python bench/chaos.py [--rounds 20] [--minutes M] [--seed 1]

``--minutes`` runs rounds until that much time has passed (then ``--rounds`` is a maximum).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fakes.chaos import Cluster, RoundResult


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=20, help="kill rounds (a maximum when --minutes is given)")
    parser.add_argument("--minutes", type=float, default=None, help="run rounds for this long")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    results: list[RoundResult] = []
    load = os.getloadavg()[0]
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        async with Cluster(Path(tmp)) as cluster:
            for number in range(args.rounds):
                if args.minutes is not None and time.monotonic() - started > args.minutes * 60:
                    break
                result = await cluster.round(rng, mid_effect=number % 2 == 1)
                results.append(result)
                how = "mid-effect" if result.kill_after < 0 else f"at {result.kill_after:.1f}s"
                took = f"{result.takeover:.1f}s" if result.takeover is not None else "-"
                print(
                    f"  round {number + 1:3d}: killed {result.victim} {how:>10}  takeover {took:>6}  "
                    f"{'ok' if result.ok else 'FAILED ' + str(result)}",
                    flush=True,
                )
    elapsed = time.monotonic() - started
    takeovers = sorted(result.takeover for result in results if result.takeover is not None)
    print(f"{len(results)} kill rounds in {elapsed / 60:.1f} min (2 replicas, seed {args.seed}, load {load:.2f})")
    print(f"  stuck jobs:         {sum(not result.finished for result in results)}")
    print(f"  lost events:        {sum(len(result.lost) for result in results)}")
    print(f"  parked events:      {sum(result.parked for result in results)}")
    print(f"  duplicate posts:    {sum(len(result.duplicates) for result in results)}")
    print(f"  missing notes:      {sum(len(result.missing) for result in results)}")
    if takeovers:
        print(
            f"  takeover seconds:   median {statistics.median(takeovers):.1f}, max {takeovers[-1]:.1f} "
            f"({len(takeovers)} kills of a replica holding work)"
        )


if __name__ == "__main__":
    asyncio.run(main())

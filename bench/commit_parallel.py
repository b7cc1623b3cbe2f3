"""A checkpoint commit of several big files at once: does it use the cores it is given?

The runner's whole commit (``CheckpointStore.commit``: every file's parts read, CRC32C'd and sent, the manifest
last) of 1 / 4 / 8 files of 256 MiB against one local moto server: wall time, the cores used (CPU time / wall, of
this process and of moto's, both on this machine), and the client's CPU per GiB against moto's own and against
the runner's S3 store uploading one file alone (``S3Store.upload_file``) in the same run.

    python bench/commit_parallel.py [--files 1,4,8] [--mib 256] [--reps 2]

moto is one Python process: it can use about one core, and on a 2-core machine it is the "network" here. The aim
(issue 52): 8 files use at least 1.8 of 2 free cores (client and store together, the store being the limit), with
the client's CPU per GiB at most 1.2x the store's. CPU is ``getrusage`` for this process (every thread) and
``psutil`` for moto's; the load average at the start of each row says how free the cores were.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import boto3
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.moto_server import AWS_TEST_ENV, moto_server, reset_moto
from bench.upload_throughput import write_synthetic
from runner.checkpoints import CheckpointStore
from runner.manifest import MANIFEST_NAME
from runner.storage.s3 import MiB, S3Store

BUCKET = "bench"
GiB = 1024 * MiB


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def moto_process() -> psutil.Process:
    found = [child for child in psutil.Process().children() if "moto.server" in " ".join(child.cmdline())]
    if len(found) != 1:
        raise SystemExit(f"expected one moto server child, found {len(found)}")
    return found[0]


def process_cpu(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


@dataclass(frozen=True, slots=True)
class Run:
    wall: float
    client_cpu: float
    store_cpu: float
    gib: float

    @property
    def client_cores(self) -> float:
        return self.client_cpu / self.wall

    @property
    def store_cores(self) -> float:
        return self.store_cpu / self.wall

    @property
    def client_per_gib(self) -> float:
        return self.client_cpu / self.gib

    @property
    def store_per_gib(self) -> float:
        return self.store_cpu / self.gib


async def measure(endpoint: str, moto: psutil.Process, source: Path, commit: bool) -> Run:
    """One commit of the directory ``source`` (``commit``) or one ``upload_file`` of its first file."""
    reset_moto(endpoint)
    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=BUCKET)
    store = S3Store(f"s3://{BUCKET}/runs/")
    files = sorted(source.iterdir())
    size = sum(path.stat().st_size for path in files) if commit else files[0].stat().st_size
    try:
        await store.put_bytes("warm-up", b"x")  # a client and a connection, as the runner has by the notice
        os.sync()
        client0, store0, wall0 = cpu_seconds(), process_cpu(moto), time.perf_counter()
        if commit:
            await CheckpointStore(store, "ft-bench", 1).commit(source, 1)
        else:
            await store.upload_file(files[0], "alone.bin")
        wall = time.perf_counter() - wall0
        run = Run(wall, cpu_seconds() - client0, process_cpu(moto) - store0, size / GiB)
        if commit:
            stored = {info.key: info.size for info in await store.list_objects("checkpoint-1/")}
            wanted = {f"checkpoint-1/{path.name}": path.stat().st_size for path in files}
            if any(stored.get(key) != value for key, value in wanted.items()) or (
                f"checkpoint-1/{MANIFEST_NAME}" not in stored
            ):
                raise SystemExit(f"the commit stored {stored}, not {wanted} and a manifest")
        return run
    finally:
        await store.close()


def median_run(runs: list[Run]) -> Run:
    return Run(
        statistics.median(run.wall for run in runs),
        statistics.median(run.client_cpu for run in runs),
        statistics.median(run.store_cpu for run in runs),
        runs[0].gib,
    )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--files", default="1,4,8", help="files per commit, comma-separated")
    parser.add_argument("--mib", type=int, default=256, help="size of each file")
    parser.add_argument("--reps", type=int, default=2, help="commits per row (medians shown)")
    args = parser.parse_args()
    counts = [int(count) for count in args.files.split(",")]
    with tempfile.TemporaryDirectory(prefix="commit-bench-") as scratch, moto_server(Path(scratch)) as endpoint:
        os.environ.update(AWS_TEST_ENV, AWS_ENDPOINT_URL=endpoint)
        moto = moto_process()
        source = Path(scratch) / "checkpoint-1"
        source.mkdir()
        print(f"moto at {endpoint} (pid {moto.pid}), {os.cpu_count()} CPUs, {args.mib} MiB per file\n")
        print(" files  load  wall s   GiB/s  cores: client+store=total  CPU-s/GiB: client store  client/store")
        alone: list[Run] = []
        for count in counts:
            for index in range(len(list(source.iterdir())), count):
                write_synthetic(source / f"shard-{index}.bin", args.mib * MiB)
            load = os.getloadavg()[0]
            runs = []
            for _ in range(args.reps):
                runs.append(await measure(endpoint, moto, source, commit=True))
                alone.append(await measure(endpoint, moto, source, commit=False))
            run = median_run(runs)
            print(
                f" {count:5} {load:5.1f} {run.wall:7.2f} {run.gib / run.wall:7.2f}        "
                f"{run.client_cores:4.2f}+{run.store_cores:4.2f}={run.client_cores + run.store_cores:4.2f}"
                f"            {run.client_per_gib:5.2f} {run.store_per_gib:5.2f}         "
                f"{run.client_per_gib / run.store_per_gib:4.2f}x"
                f"   (walls {' '.join(f'{r.wall:.2f}' for r in runs)})"
            )
        solo = median_run(alone)
        print(
            f"\nS3Store.upload_file of one {args.mib} MiB file alone (median of {len(alone)}): "
            f"client {solo.client_per_gib:.2f} CPU-s/GiB, store {solo.store_per_gib:.2f}, {solo.wall:.2f} s"
        )


if __name__ == "__main__":
    asyncio.run(main())

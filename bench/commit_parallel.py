"""A checkpoint commit of several big files at once: does it use the cores it is given?

The runner's whole commit (``CheckpointStore.commit``: every file's parts read, CRC32C'd and sent, the manifest
last) of 1 / 4 / 8 files of 256 MiB against one local moto server: wall time, the cores used (CPU time / wall, of
this process and of moto's, both on this machine), and the client's CPU per GiB against moto's own and against
the runner's S3 store uploading one file alone (``S3Store.upload_file``) in the same run.

    python bench/commit_parallel.py [--store moto|sink] [--files 1,4,8] [--mib 256] [--reps 2] [--lanes 1,2]

moto is one Python process: it can use about one core, and here it burns 10-20 CPU-s per GiB, so against it the
commit is moto's throughput and the client idles. ``--store sink`` (:mod:`bench.s3_sink`, two processes that read
every body and keep nothing) shows what the client can do. The aim (issue 52): 8 files use at least 1.8 of 2 free
cores, the client's CPU per GiB at most 1.2x the store's own (the store alone: ``S3Store.upload_file``, the
figure docs/benchmarks.md has always compared the commit with). CPU is ``getrusage`` for this process (every
thread) and ``psutil`` for the store's processes; the load average at the start of each row says how free the
cores were (other sessions and CI share this machine's 2). ``--lanes`` compares the store's send lanes
(:mod:`runner.storage.lanes`), interleaved so that each count sees the same load; the last column is the busiest
client thread's CPU per GiB, and the GiB/s one core's worth of it allows: what bounds the commit whatever the cores,
and the figure a shared machine does not blur.

Today (2 cores, sink, medians of 3; the sink itself takes 0.6-0.8 of the cores):

    load 0.2-0.7, lanes 1 and 2 interleaved (one send lane is about the one event loop of before):
    files lanes  wall s  GiB/s  cores client+store  CPU-s/GiB client  busiest thread CPU-s/GiB (GiB/s)
      1     1    0.34    0.73    0.89+0.61            1.23               0.48 (2.1)
      1     2    0.28    0.89    0.97+0.71            1.09               0.36 (2.8)
      4     1    0.95    1.05    0.97+0.82            0.93               0.51 (2.0)
      4     2    0.96    1.04    1.01+0.80            0.97               0.31 (3.2)
      8     1    1.88    1.06    1.02+0.75            0.96               0.56 (1.8)
      8     2    1.90    1.05    0.98+0.87 = 1.85     0.93               0.30 (3.3)   alone: client 0.98 (0.95x)
    8 files, before the lanes (all sends on one loop) and after, one after the other:
      load 1.6 / 1.9: before 1.63 s, 1.22 GiB/s, cores 1.11+0.69 = 1.80, client 0.90, busiest 0.57
                      lanes  1.83 s, 1.09 GiB/s, cores 1.07+0.78 = 1.85, client 0.98, busiest 0.29
      load 2.8-3.4, twice each, interleaved: before 1.86 / 1.70 s, 1.78 cores, busiest 0.59;
                      lanes 1.80 / 1.82 s, 1.82 / 1.74 cores, client 0.98-1.01 against 1.00 alone, busiest 0.30
    taskset -c 0 (client and sink on one core, one lane by default), load 2.0: 3.37 s, 0.59 GiB/s, 0.57+0.41 cores

On these 2 cores the client and the sink together fill both before and after the lanes (1.8 cores): what the lanes
change is the ceiling. Before, one thread (the event loop: 1.90 of its 1.97 CPU-s in ``socket.send``, cProfile)
carried 0.59 CPU-s of every GiB, so no number of cores took the commit past ~1.7 GiB/s; with K lanes the busiest
thread carries about 0.6 / K (0.30 with two), so it grows with the cores it is given, up to the lanes (one per core,
at most the store's requests in flight, 8 by default).

Before the lanes (2 cores; sink: load 0.1-0.7, medians of 3; moto: load 0.8-1.8, one run):

    sink  1 file  0.33 s 0.77 GiB/s cores 0.92+0.70  client 1.20 CPU-s/GiB   alone: client 1.17
          4 files 1.08 s 0.93 GiB/s cores 1.06+0.72  client 1.15
          8 files 2.19 s 0.91 GiB/s cores 1.05+0.74  client 1.15 (0.98x the store alone; 1.80 of 2 cores)
    moto  1 file  2.00 s 0.13 GiB/s cores 0.21+1.08  client 1.67, moto 8.64   alone: client 1.27
          4 files 7.55 s 0.13 GiB/s cores 0.18+1.41  client 1.33, moto 10.63
          8 files 16.64 s 0.12 GiB/s cores 0.16+1.22 client 1.32, moto 10.17
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
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


def thread_cpu() -> dict[int, float]:
    """CPU seconds of each of this process's threads (Linux: /proc/self/task), by thread id."""
    tick = os.sysconf("SC_CLK_TCK")
    found = {}
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(FileNotFoundError):  # a thread that ended meanwhile
            fields = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
            found[int(tid)] = (int(fields[11]) + int(fields[12])) / tick  # utime, stime
    return found


def server_processes(module: str) -> list[psutil.Process]:
    """The store's processes: this process's child running ``module``, and its own children."""
    found = [child for child in psutil.Process().children() if module in " ".join(child.cmdline())]
    if len(found) != 1:
        raise SystemExit(f"expected one {module} child, found {len(found)}")
    return [found[0], *found[0].children(recursive=True)]


def process_cpu(processes: list[psutil.Process]) -> float:
    return sum(times.user + times.system for times in (process.cpu_times() for process in processes))


@contextlib.contextmanager
def sink_server() -> Iterator[str]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    root = Path(__file__).resolve().parents[1]
    command = [sys.executable, "-m", "bench.s3_sink", "--port", str(port), "--processes", "2"]
    proc = subprocess.Popen(command, cwd=root)
    try:
        deadline = time.monotonic() + 30
        while True:
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    break
            if time.monotonic() > deadline:
                raise SystemExit("the sink did not come up")
            time.sleep(0.1)
        time.sleep(1.0)  # its second process binds too
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)


@dataclass(frozen=True, slots=True)
class Run:
    wall: float
    client_cpu: float
    store_cpu: float
    gib: float
    busiest_thread_cpu: float  # the client thread that worked most: one core's worth of it bounds the throughput

    @property
    def client_cores(self) -> float:
        return self.client_cpu / self.wall

    @property
    def store_cores(self) -> float:
        return self.store_cpu / self.wall

    @property
    def busiest_per_gib(self) -> float:
        return self.busiest_thread_cpu / self.gib

    @property
    def client_per_gib(self) -> float:
        return self.client_cpu / self.gib

    @property
    def store_per_gib(self) -> float:
        return self.store_cpu / self.gib


async def measure(
    endpoint: str, server: list[psutil.Process], source: Path, commit: bool, check: bool, lanes: int | None
) -> Run:
    """One commit of the directory ``source`` (``commit``) or one ``upload_file`` of its first file; ``check``:
    against moto, which keeps what it gets (the sink keeps nothing to check); ``lanes``: the store's send lanes
    (None: its default, one per core this process may use)."""
    if check:
        reset_moto(endpoint)
        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=BUCKET)
    store = S3Store(f"s3://{BUCKET}/runs/", lanes=lanes)
    files = sorted(source.iterdir())
    size = sum(path.stat().st_size for path in files) if commit else files[0].stat().st_size
    try:
        await store.put_bytes("warm-up", b"x")  # a client, its lanes and a connection, as the runner has by then
        os.sync()
        threads0 = thread_cpu()
        client0, store0, wall0 = cpu_seconds(), process_cpu(server), time.perf_counter()
        if commit:
            await CheckpointStore(store, "ft-bench", 1).commit(source, 1)
        else:
            await store.upload_file(files[0], "alone.bin")
        wall = time.perf_counter() - wall0
        client, server_cpu, threads = cpu_seconds() - client0, process_cpu(server) - store0, thread_cpu()
        busiest = max(cpu - threads0.get(tid, 0.0) for tid, cpu in threads.items())
        run = Run(wall, client, server_cpu, size / GiB, busiest)
        if commit and check:
            stored = {info.key: info.size for info in await store.list_objects("checkpoint-1/")}
            wanted = {f"checkpoint-1/{path.name}": path.stat().st_size for path in files}
            if any(stored.get(key) != value for key, value in wanted.items()) or (
                f"checkpoint-1/{MANIFEST_NAME}" not in stored
            ):
                raise SystemExit(f"the commit stored {stored}, not {wanted} and a manifest")
        return run
    finally:
        await store.close()


def report(count: int, lanes: int, load: float, run: Run, runs: list[Run]) -> None:
    print(
        f" {count:5} {lanes:5} {load:5.1f} {run.wall:7.2f} {run.gib / run.wall:7.2f}        "
        f"{run.client_cores:4.2f}+{run.store_cores:4.2f}={run.client_cores + run.store_cores:4.2f}"
        f"            {run.client_per_gib:5.2f} {run.store_per_gib:5.2f}         "
        f"{run.client_per_gib / run.store_per_gib:4.2f}x"
        f"      {run.busiest_per_gib:5.2f} ({1 / run.busiest_per_gib:4.1f})"
        f"   (walls {' '.join(f'{r.wall:.2f}' for r in runs)})"
    )


def median_run(runs: list[Run]) -> Run:
    return Run(
        statistics.median(run.wall for run in runs),
        statistics.median(run.client_cpu for run in runs),
        statistics.median(run.store_cpu for run in runs),
        runs[0].gib,
        statistics.median(run.busiest_thread_cpu for run in runs),
    )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--files", default="1,4,8", help="files per commit, comma-separated")
    parser.add_argument("--mib", type=int, default=256, help="size of each file")
    parser.add_argument("--reps", type=int, default=2, help="commits per row (medians shown)")
    parser.add_argument("--store", choices=("moto", "sink"), default="moto")
    parser.add_argument("--lanes", default="", help="send lanes to compare, comma-separated (default: the store's)")
    args = parser.parse_args()
    counts = [int(count) for count in args.files.split(",")]
    lane_counts: list[int | None] = [int(count) for count in args.lanes.split(",")] if args.lanes else [None]
    moto = args.store == "moto"
    with contextlib.ExitStack() as stack:
        scratch = stack.enter_context(tempfile.TemporaryDirectory(prefix="commit-bench-"))
        endpoint = stack.enter_context(moto_server(Path(scratch)) if moto else sink_server())
        os.environ.update(AWS_TEST_ENV, AWS_ENDPOINT_URL=endpoint)
        server = server_processes("moto.server" if moto else "bench.s3_sink")
        source = Path(scratch) / "checkpoint-1"
        source.mkdir()
        print(f"{args.store} at {endpoint} ({len(server)} processes), {os.cpu_count()} CPUs, {args.mib} MiB per file\n")
        default_lanes = S3Store(f"s3://{BUCKET}/").lane_count
        print(f"send lanes by default: {default_lanes} (this process may use {len(os.sched_getaffinity(0))} cores)")
        print(
            " files lanes  load  wall s   GiB/s  cores: client+store=total  CPU-s/GiB: client store  client/store"
            "  busiest thread CPU-s/GiB (GiB/s it allows)"
        )
        alone: list[Run] = []
        for count in counts:
            for index in range(len(list(source.iterdir())), count):
                write_synthetic(source / f"shard-{index}.bin", args.mib * MiB)
            load = os.getloadavg()[0]
            runs: dict[int | None, list[Run]] = {lanes: [] for lanes in lane_counts}
            for _ in range(args.reps):  # interleaved, so that each lane count sees the same load
                for lanes in lane_counts:
                    runs[lanes].append(await measure(endpoint, server, source, True, moto, lanes))
                alone.append(await measure(endpoint, server, source, False, moto, lane_counts[0]))
            for lanes, rows in runs.items():
                report(count, lanes or default_lanes, load, median_run(rows), rows)
        solo = median_run(alone)
        print(
            f"\nS3Store.upload_file of one {args.mib} MiB file alone (median of {len(alone)}): "
            f"client {solo.client_per_gib:.2f} CPU-s/GiB, store {solo.store_per_gib:.2f}, {solo.wall:.2f} s; "
            "each commit's client CPU per GiB against it: see the rows"
        )


if __name__ == "__main__":
    asyncio.run(main())

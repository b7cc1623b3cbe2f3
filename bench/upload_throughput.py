"""Upload/download throughput: S3Store vs boto3's default ``upload_file``, against a local moto server.

Run: ``.venv/bin/python bench/upload_throughput.py [--size-mib 1024] [--reps 2]``. Not a test.

Both sides talk to the same moto server in the same run, alternating, so machine noise hits both. moto
(one Python process) is the bottleneck on a small box, so this measures per-request overhead as much as
bandwidth: what it rewards is fewer, larger requests and no redundant hashing.
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
from pathlib import Path
from typing import Any

import boto3

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from runner.storage.s3 import DEFAULT_CONCURRENCY, DEFAULT_PART_SIZE, MiB, S3Store
from tests.servers import AWS_TEST_ENV, moto_server, reset_moto

BUCKET = "bench"
BLOCK = 64 * MiB


def write_synthetic(path: Path, size: int) -> None:
    """Incompressible-looking bytes fast: one random block, repeated (nothing here dedups)."""
    block = os.urandom(min(BLOCK, size))
    with open(path, "wb") as file:
        left = size
        while left:
            piece = block[: min(len(block), left)]
            file.write(piece)
            left -= len(piece)


def rate(size: int, seconds: float) -> float:
    return size / MiB / seconds


class PhaseClock:
    """Wall time of a multipart upload, split at the moment CompleteMultipartUpload is sent.

    moto assembles the object on completion with several full in-memory copies, a fixed cost per byte
    that no client can change; the part phase before it is what the client's strategy decides.
    """

    def __init__(self, client: Any) -> None:
        self.complete_sent = 0.0
        client.meta.events.register("before-call.s3.CompleteMultipartUpload", self._mark)

    def _mark(self, **_: Any) -> None:
        self.complete_sent = time.perf_counter()


def cpu_seconds() -> float:
    """User + system CPU of this process, threads included: what the client itself burns."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--size-mib", type=int, default=1024, help="synthetic file size (default 1024)")
    parser.add_argument("--reps", type=int, default=3, help="repetitions of each measurement (default 3)")
    parser.add_argument("--part-size-mib", type=int, default=DEFAULT_PART_SIZE // MiB)
    parser.add_argument("--concurrency", type=int, default=DEFAULT_CONCURRENCY)
    parser.add_argument("--boto3-download", action="store_true", help="also time boto3's download_file (slow on moto)")
    args = parser.parse_args()
    size = args.size_mib * MiB
    part_size = args.part_size_mib * MiB

    with tempfile.TemporaryDirectory(prefix="upload-bench-") as scratch, moto_server(Path(scratch)) as endpoint:
        os.environ.update(AWS_TEST_ENV)
        os.environ["AWS_ENDPOINT_URL"] = endpoint
        source = Path(scratch) / "payload.bin"
        write_synthetic(source, size)
        target = Path(scratch) / "restored.bin"
        print(f"file {args.size_mib} MiB, moto at {endpoint}, {os.cpu_count()} CPUs")
        print(f"S3Store: part_size {args.part_size_mib} MiB, concurrency {args.concurrency}")
        print("boto3:   client.upload_file with the default TransferConfig (8 MiB parts, 10 threads)\n")

        results: dict[str, list[float]] = {
            "boto3 upload": [],
            "S3Store upload": [],
            "boto3 part phase": [],
            "S3Store part phase": [],
            "S3Store download": [],
            "boto3 download": [],
        }
        client_cpu: dict[str, list[float]] = {"boto3": [], "S3Store": []}

        def fresh_bucket() -> Any:
            reset_moto(endpoint)  # moto keeps objects in memory: start each round empty
            target.unlink(missing_ok=True)
            os.sync()  # the last round's downloaded GiB must not be written back during this one
            client = boto3.client("s3")
            client.create_bucket(Bucket=BUCKET)
            return client

        def boto3_round() -> None:
            client = fresh_bucket()
            client.head_bucket(Bucket=BUCKET)  # warm the connection
            clock = PhaseClock(client)
            cpu, start = cpu_seconds(), time.perf_counter()
            client.upload_file(str(source), BUCKET, "runs/payload.bin")
            record("boto3", start, time.perf_counter(), clock, cpu)
            if args.boto3_download:
                start = time.perf_counter()
                client.download_file(BUCKET, "runs/payload.bin", str(target))
                results["boto3 download"].append(rate(size, time.perf_counter() - start))

        async def store_round() -> None:
            fresh_bucket()
            store = S3Store(f"s3://{BUCKET}/runs/", part_size=part_size, concurrency=args.concurrency)
            try:
                await store.put_bytes("warm-up", b"x")  # client creation is not upload time
                clock = PhaseClock(await store._client())
                cpu, start = cpu_seconds(), time.perf_counter()
                await store.upload_file(source, "payload.bin")
                record("S3Store", start, time.perf_counter(), clock, cpu)
                start = time.perf_counter()
                await store.download_file("payload.bin", target)
                results["S3Store download"].append(rate(size, time.perf_counter() - start))
            finally:
                await store.close()
            if target.read_bytes() != source.read_bytes():
                raise SystemExit("S3Store download differs from the source")

        def record(name: str, start: float, end: float, clock: PhaseClock, cpu_start: float) -> None:
            client_cpu[name].append((cpu_seconds() - cpu_start) / (size / 1024 / MiB))
            results[f"{name} upload"].append(rate(size, end - start))
            if clock.complete_sent:
                results[f"{name} part phase"].append(rate(size, clock.complete_sent - start))

        for rep in range(1, args.reps + 1):
            # Alternate who goes first, so warm-up and drift do not favour one side.
            if rep % 2:
                boto3_round()
                asyncio.run(store_round())
            else:
                asyncio.run(store_round())
                boto3_round()
            print(
                f"rep {rep}: "
                + ", ".join(f"{name} {values[-1]:.1f}" for name, values in results.items() if values)
                + " MiB/s"
            )

        print()
        for name, values in results.items():
            if values:
                runs = " ".join(f"{v:.1f}" for v in values)
                print(f"{name:19} median {statistics.median(values):7.1f} MiB/s   (runs: {runs})")
        for name, values in client_cpu.items():
            runs = " ".join(f"{v:.2f}" for v in values)
            print(f"{name + ' client CPU':19} median {statistics.median(values):7.2f} s/GiB    (runs: {runs})")
        for what in ("upload", "part phase"):
            mine, theirs = results[f"S3Store {what}"], results[f"boto3 {what}"]
            if mine and theirs:
                ratio = statistics.median(mine) / statistics.median(theirs)
                print(f"S3Store / boto3 default, {what}: {ratio:.2f}x")
        print("(target: upload >= 1.5x; the part phase excludes moto's fixed-cost object assembly)")


if __name__ == "__main__":
    main()

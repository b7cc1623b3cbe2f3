"""Upload throughput and client CPU per GiB: the runner's S3Store, boto3 ``upload_file`` with its defaults, and
boto3's CRT transfer client (``boto3[crt]``), against one local moto server, in one run, at several sizes.

Run: ``.venv/bin/python bench/upload_throughput.py [--sizes-mib 64,256,1024] [--reps 2]``. Not a test.

The three clients take turns on the same server (the order rotates each round, so warm-up and drift favour
no one). moto is one Python process and the bottleneck on a small box: throughput here says more about the
server than the clients. What a client decides is how much CPU it burns per byte: with the instance's cores
busy training until the notice, and the GPU host's network far faster than moto, CPU-seconds per GiB is the
figure to beat. It is measured with ``getrusage`` over the whole upload, every thread of this process
included (the CRT's native ones too); moto runs in another process and is not counted.

boto3's own CRT integration always targets AWS endpoints, so the CRT client is built the way it builds it
(``s3transfer.crt``), but pointed at moto.
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

import boto3
import botocore.session
from s3transfer.crt import (
    BotocoreCRTCredentialsWrapper,
    BotocoreCRTRequestSerializer,
    CRTTransferManager,
    create_s3_crt_client,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.moto_server import AWS_TEST_ENV, moto_server, reset_moto
from runner.checkpoints import CheckpointStore
from runner.storage.s3 import DEFAULT_CONCURRENCY, DEFAULT_PART_SIZE, MiB, S3Store

BUCKET = "bench"
BLOCK = 64 * MiB
GiB = 1024 * MiB
CLIENTS = ("S3Store", "boto3 default", "boto3 CRT", "runner commit")


def write_synthetic(path: Path, size: int) -> None:
    """Incompressible-looking bytes fast: one random block, repeated (nothing here dedups)."""
    block = os.urandom(min(BLOCK, size))
    with open(path, "wb") as file:
        left = size
        while left:
            piece = block[: min(len(block), left)]
            file.write(piece)
            left -= len(piece)


def _same_file(left: Path, right: Path) -> bool:
    with left.open("rb") as a, right.open("rb") as b:
        while True:
            first, second = a.read(BLOCK), b.read(BLOCK)
            if first != second:
                return False
            if not first:
                return True


def cpu_seconds() -> float:
    """User + system CPU of this process, all threads included: what the client itself burns."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class Bench:
    def __init__(self, endpoint: str, part_size: int, concurrency: int) -> None:
        self.endpoint = endpoint
        self.downloads: list[float] = []  # MiB/s of S3Store downloads of what it uploaded
        self.part_size = part_size
        self.concurrency = concurrency
        session = botocore.session.Session()
        provider = BotocoreCRTCredentialsWrapper(session.get_credentials()).to_crt_credentials_provider()
        self.crt = CRTTransferManager(
            create_s3_crt_client("us-east-1", provider, use_ssl=False),
            BotocoreCRTRequestSerializer(session, {"endpoint_url": endpoint, "region_name": "us-east-1"}),
        )

    def fresh_bucket(self) -> Any:
        reset_moto(self.endpoint)  # moto keeps objects in memory: start each upload empty
        client = boto3.client("s3", endpoint_url=self.endpoint)
        client.create_bucket(Bucket=BUCKET)
        client.head_bucket(Bucket=BUCKET)  # connection warm, client built: neither is upload time
        return client

    def measure(self, name: str, source: Path) -> tuple[float, float]:
        """(MiB/s, CPU s/GiB) of one upload of ``source`` by client ``name``."""
        client = self.fresh_bucket()
        upload: Callable[[], None]
        if name == "boto3 default":

            def upload() -> None:
                client.upload_file(str(source), BUCKET, "runs/payload.bin")
        elif name == "boto3 CRT":

            def upload() -> None:
                self.crt.upload(str(source), BUCKET, "runs/payload.bin").result()
        else:
            prefix = "runs/" if name == "S3Store" else "runs/checkpoint-1/"
            store = S3Store(f"s3://{BUCKET}/{prefix}", part_size=self.part_size, concurrency=self.concurrency)

            def upload() -> None:
                async def go() -> None:
                    try:
                        await store.put_bytes("warm-up", b"x")
                        started[0], started[1] = cpu_seconds(), time.perf_counter()
                        if name == "S3Store":
                            await store.upload_file(source, "payload.bin")
                        else:  # the whole commit: the file, its parts' CRCs kept for the manifest, the manifest
                            await CheckpointStore(store, "ft-bench", 1).commit(source.parent, 1)
                        ended[0], ended[1] = cpu_seconds(), time.perf_counter()
                        if name == "S3Store":  # and back: ranged GETs streamed to disk
                            target = source.parent.parent / "restored.bin"
                            begun = time.perf_counter()
                            await store.download_file("payload.bin", target)
                            self.downloads.append(source.stat().st_size / MiB / (time.perf_counter() - begun))
                            if not _same_file(target, source):
                                raise SystemExit("S3Store download differs from the source")
                            target.unlink()
                    finally:
                        await store.close()

                asyncio.run(go())

        started, ended = [0.0, 0.0], [0.0, 0.0]
        if name.startswith("boto3"):
            started[0], started[1] = cpu_seconds(), time.perf_counter()
            upload()
            ended[0], ended[1] = cpu_seconds(), time.perf_counter()
        else:
            upload()
        size = source.stat().st_size
        key = "runs/checkpoint-1/checkpoint-1/payload.bin" if name == "runner commit" else "runs/payload.bin"
        head = client.head_object(Bucket=BUCKET, Key=key)
        if int(head["ContentLength"]) != size:
            raise SystemExit(f"{name} stored {head['ContentLength']} bytes, not {size}")
        return size / MiB / (ended[1] - started[1]), (ended[0] - started[0]) / (size / GiB)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--sizes-mib", default="64,256,1024", help="file sizes, comma-separated")
    parser.add_argument("--reps", type=int, default=2, help="uploads per client and size")
    parser.add_argument("--part-size-mib", type=int, default=DEFAULT_PART_SIZE // MiB)
    parser.add_argument("--concurrency", type=int, default=DEFAULT_CONCURRENCY)
    args = parser.parse_args()
    sizes = [int(size) for size in args.sizes_mib.split(",")]

    with tempfile.TemporaryDirectory(prefix="upload-bench-") as scratch, moto_server(Path(scratch)) as endpoint:
        os.environ.update(AWS_TEST_ENV)
        os.environ["AWS_ENDPOINT_URL"] = endpoint
        bench = Bench(endpoint, args.part_size_mib * MiB, args.concurrency)
        print(f"moto at {endpoint}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start")
        print(f"S3Store:       part size {args.part_size_mib} MiB, {args.concurrency} in flight, CRC32C per part")
        print("boto3 default: client.upload_file, default TransferConfig (8 MiB parts, 10 threads)")
        print("boto3 CRT:     s3transfer's CRTTransferManager (awscrt S3 client, 8 MiB parts)")
        print("runner commit: CheckpointStore.commit of a directory holding the file: S3Store's parts, whose")
        print("               CRC32Cs the manifest keeps (no second pass over the bytes), and the manifest\n")
        summary: list[tuple[int, dict[str, tuple[float, float]]]] = []
        for size_mib in sizes:
            (Path(scratch) / "checkpoint").mkdir(exist_ok=True)
            source = Path(scratch) / "checkpoint" / "payload.bin"
            write_synthetic(source, size_mib * MiB)
            runs: dict[str, list[tuple[float, float]]] = {name: [] for name in CLIENTS}
            for rep in range(args.reps * len(CLIENTS)):
                name = CLIENTS[(rep + rep // len(CLIENTS)) % len(CLIENTS)]  # rotate who goes first each round
                os.sync()
                runs[name].append(bench.measure(name, source))
            source.unlink()
            medians = {
                name: (statistics.median(r for r, _ in got), statistics.median(c for _, c in got))
                for name, got in runs.items()
            }
            summary.append((size_mib, medians))
            print(f"{size_mib} MiB:")
            for name, got in runs.items():
                rates = " ".join(f"{rate:.0f}" for rate, _ in got)
                cpus = " ".join(f"{cpu:.2f}" for _, cpu in got)
                rate, cpu = medians[name]
                print(f"  {name:14} {rate:7.1f} MiB/s  {cpu:5.2f} CPU-s/GiB   (runs: {rates} MiB/s; {cpus} s/GiB)")
            downloads = " ".join(f"{rate:.0f}" for rate in bench.downloads)
            print(f"  S3Store download {statistics.median(bench.downloads):5.1f} MiB/s   (runs: {downloads} MiB/s)")
            bench.downloads.clear()
        print("\nS3Store's client CPU per GiB against the others (median; aim: <= 0.5 of boto3's), and the whole")
        print("commit's against the store's own (aim: <= 1.2):")
        for size_mib, medians in summary:
            mine = medians["S3Store"][1]
            print(
                f"  {size_mib:5} MiB: {mine / medians['boto3 default'][1]:.2f} of boto3 default, "
                f"{mine / medians['boto3 CRT'][1]:.2f} of boto3 CRT; commit {medians['runner commit'][1] / mine:.2f}"
                " of S3Store"
            )


if __name__ == "__main__":
    main()

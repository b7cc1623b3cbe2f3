"""Notice → durable on real GPU hosts, from the figures measured here and the hosts' documented limits.

    python bench/notice_model.py [--save-cpu-s-per-gib 0.6] [--commit-cpu-s-per-gib 1.10] [--overlap 1.19]
        [--step-seconds 2] [--detect-seconds 0.49] [--part-mib 16] [--commit-cores 8] [--nvme-gbytes-per-s 2]
        [--oss-upload-gbps 20]

Pure arithmetic, no I/O: whether a checkpoint written on the notice (every rank saving its shard to local disk)
and committed to the object store (the runner's parallel upload, overlapped with the save) is durable before the
cloud reclaims the host. Per node, for ``B`` bytes (a job's checkpoint over its nodes, each node committing its
share; 1 GB = 10^9 bytes)::

    physical limit  = max(B / disk write, B / network)        network = min(the host's NIC to the store, the
                                                                         store's shared bandwidth / nodes, the
                                                                         store's request rate × part / nodes)
    CPU bound       = max(B / (ranks × 1 GiB / save CPU-s),   a rank saves with one core; the commit gets the
                          B / (cores × 1 GiB / commit CPU-s)) physical cores the ranks leave (vCPUs / 2 − ranks),
                                                              at most its send lanes (8: one per request in flight)
    save            = B / min(disk write, the ranks' CPU)
    upload          = B / min(network, the commit's CPU)
    durable         = detect + a step + overlap × max(save, upload)

``overlap`` is the runner's own: parts go up while the file grows, so notice → committed is measured at 0.96–1.19 ×
max(save, upload) for a steady writer at 1 GiB (docs/benchmarks.md); the default takes the worse.

Measured here (2-core development machine; docs/benchmarks.md, ``bench/commit_parallel.py``,
``bench/notice_to_commit.py``): a commit of 8 files of 256 MiB costs the client **1.10 CPU-s per GiB** (against
``bench/s3_sink.py``, a store that costs little; against moto, whose slow answers the client waits on, 1.3–1.5), and
its sends run on the store's send lanes (``runner.storage.lanes``: a thread, event loop and client each, one per core
up to the requests in flight, 8 by default, ``FINETUNE_S3_CONCURRENCY``), so it grows with its cores up to 8: no
thread of it is busy for more than 0.35 CPU-s of a GiB with two lanes (0.93 when every send ran on one event loop); a
1 GiB checkpoint saved at disk speed by one process took **0.6 s** (1.7 s in a run at load 5–8; no GPU-to-host copy
in it), taken here as one core's rate for one rank; notice detection p99 **0.49 s**. Each is a flag.

Host limits (documented unless marked *assumed*):

- **p5.48xlarge**: 192 vCPUs, 8 × H100. Network 3,200 Gbps, but that is EFA for GPU-to-GPU traffic; what the CPU
  can send to S3 is **400 Gbps**: the AWS Common Runtime's own table (awslabs/aws-c-s3, ``source/s3_platform_info.c``:
  "From the CPU we'll be able to get around 400 Gbps"). Instance store 8 × 3.84 TB NVMe (EC2 accelerated computing
  specifications); AWS publishes no write throughput for it: *assumed* 2 GB/s a drive, 16 GB/s for the eight.
- **p4d.24xlarge**: 96 vCPUs, 8 × A100. Network 400 Gbps (EC2 specifications; the same 400 in aws-c-s3's table).
  Instance store 8 × 1 TB NVMe; *assumed* 2 GB/s a drive, as above.
- **S3**: no bandwidth limit per bucket or account is published; 3,500 PUT/s per partitioned prefix (S3 user guide,
  "Best practices design patterns: optimizing Amazon S3 performance") until S3 splits a hot prefix. A job's nodes
  write under one ``checkpoint-<step>/`` prefix, so the job shares one prefix's rate: with 16 MiB parts
  (``runner.storage.s3.DEFAULT_PART_SIZE``) 58.7 GB/s for the whole job.
- **ecs.ebmgn8v.48xlarge** (Alibaba Cloud's 8-GPU bare metal, 8 × 96 GB): 192 vCPUs, network baseline **170 Gbit/s**
  (85 × 2), maximum disk bandwidth **6 Gbit/s** (ECS instance families, ebmgn8v); it has no local NVMe: the save
  goes to cloud disks. Whether it is sold as a preemptible instance in a given zone is not checked here.
- **OSS**: total upload bandwidth **20 Gbit/s per account per region**, internal and public together (China
  (Shanghai / Shenzhen / Beijing / Hangzhou), Singapore; 2–10 Gbit/s elsewhere): OSS "Limits and performance
  metrics". It is the account's, so every node of a job (and every other writer in the account) shares it.
  10,000 requests/s per bucket (OSS "How do I troubleshoot bandwidth or QPS overrun for buckets").
- **Notices**: AWS 120 s (EC2 "Spot Instance interruption notices"); Alibaba 300 s, the interruption event five
  minutes before a preemptible instance is released (CloudMonitor; ``handlers.aliyun_events.NOTICE_LEAD``).

Jobs (Adam in mixed precision: 16 bytes a parameter with the optimizer state, as issue 52 counts it):
7B LoRA 0.5 GB (*assumed*: ~40 M trainable parameters × 12 bytes, the adapter and its Adam moments in fp32); 7B
full 112 GB on one node; 70B LoRA 2.5 GB over 8 nodes (*assumed*: ~207 M parameters at rank 16 on every linear
layer × 12 bytes); 70B full 1,120 GB over 8 nodes (140 GB a node). A step in flight: *assumed* 2 s.

Recorded (defaults)::

    host                 job         GB/node notice physical CPU save/commit     save   upload  durable fits set by
    p5.48xlarge          7B LoRA        0.50  120 s   0.03 s   0.03 / 0.06 s   0.03 s   0.06 s   2.57 s yes  commit CPU
    p5.48xlarge          7B full      112.00  120 s   7.00 s   7.82 / 14.3 s   7.82 s   14.3 s   19.6 s yes  commit CPU
    p5.48xlarge          70B LoRA x8    0.31  120 s   0.04 s   0.02 / 0.04 s   0.02 s   0.04 s   2.54 s yes  S3 requests
    p5.48xlarge          70B full x8  140.00  120 s   19.1 s   9.78 / 17.9 s   9.78 s   19.1 s   25.2 s yes  S3 requests
    p4d.24xlarge         7B LoRA        0.50  120 s   0.03 s   0.03 / 0.06 s   0.03 s   0.06 s   2.57 s yes  commit CPU
    p4d.24xlarge         7B full      112.00  120 s   7.00 s   7.82 / 14.3 s   7.82 s   14.3 s   19.6 s yes  commit CPU
    p4d.24xlarge         70B LoRA x8    0.31  120 s   0.04 s   0.02 / 0.04 s   0.02 s   0.04 s   2.54 s yes  S3 requests
    p4d.24xlarge         70B full x8  140.00  120 s   19.1 s   9.78 / 17.9 s   9.78 s   19.1 s   25.2 s yes  S3 requests
    ecs.ebmgn8v.48xlarge 7B LoRA        0.50  300 s   0.67 s   0.03 / 0.06 s   0.67 s   0.20 s   3.28 s yes  disk
    ecs.ebmgn8v.48xlarge 7B full      112.00  300 s  149.3 s   7.82 / 14.3 s  149.3 s   44.8 s  180.2 s yes  disk
    ecs.ebmgn8v.48xlarge 70B LoRA x8    0.31  300 s   1.00 s   0.02 / 0.04 s   0.42 s   1.00 s   3.68 s yes  OSS share
    ecs.ebmgn8v.48xlarge 70B full x8  140.00  300 s  448.0 s   9.78 / 17.9 s  186.7 s  448.0 s  535.6 s NO   OSS share

What it says: on AWS every case fits the two minutes several times over. For one node's full checkpoint what sets
the time is the commit's eight send lanes (8 cores at 1.10 CPU-s per GiB, 7.8 GB/s: 7B full 14.3 s, the ranks' save
7.8 s overlapping it), and for 70B over eight nodes S3's 3,500 PUTs/s on one prefix (58.7 GB/s for the whole job:
25 s; ``--part-mib 64``: the lanes again, 24 s). More requests in flight (``FINETUNE_S3_CONCURRENCY``, and with it
more lanes, up to 16) take the commit towards the host's network (``--commit-cores 16``: 7B full durable in 11.8 s,
70B full with 64 MiB parts in 14.1 s, both set by the save). Before the send lanes the commit's sends ran on one
event loop, about one core (``--commit-cores 1``: 0.98 GB/s, 7B full 139 s and 70B full 173 s, past AWS's two
minutes on both hosts).
On Alibaba the limits are the cloud's: a cloud disk at 6 Gbit/s makes a 112 GB save take 2.5 minutes (the host's
1 TiB of memory would hold it), and the account's 20 Gbit/s of OSS upload, shared by eight nodes, makes 1.12 TB take
7.5 minutes against a 5-minute notice: a 70B full fine-tune there cannot be made durable on the notice at any speed
of the runner's, only by the periodic saves before it.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import NoReturn

GB = 10**9
GiB = 2**30
MiB = 2**20


def gbps(gigabits: float) -> float:
    """Bytes per second of a link quoted in Gbit/s."""
    return gigabits * GB / 8


def _check(obj: object, *names: str, low: float = 0.0, inclusive: bool = False, optional: bool = False) -> None:
    """Each named field a finite number above ``low`` (or at it, ``inclusive``); None only where ``optional``."""
    for name in names:
        value = getattr(obj, name)
        if value is None and optional:
            continue
        number = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        if not number or value < low or (value == low and not inclusive):
            bound = f"{'≥' if inclusive else '>'} {low:g}"
            raise ValueError(f"{type(obj).__name__}.{name} must be a finite number {bound}, not {value!r}")


@dataclass(frozen=True)
class Measured:
    """What this project's code costs, measured on the development machine."""

    save_cpu_s_per_gib: float = 0.6  # one rank writing its shard (notice_to_commit.py, 1 GiB at disk speed)
    commit_cpu_s_per_gib: float = 1.10  # a commit's client CPU (commit_parallel.py, 8 files of 256 MiB, sink)
    overlap: float = 1.19  # notice → committed over max(save, upload), the worse of the measured 0.96 / 1.19
    detect_s: float = 0.49  # notice detection p99 (notice_latency.py)
    step_s: float = 2.0  # the step in flight before the save starts (assumed)
    part_bytes: int = 16 * MiB  # runner.storage.s3.DEFAULT_PART_SIZE
    commit_cores: int | None = 8  # the store's send lanes: one per request in flight (None: every core left)

    def __post_init__(self) -> None:
        _check(self, "overlap", low=1.0, inclusive=True)
        _check(self, "save_cpu_s_per_gib", "commit_cpu_s_per_gib", "part_bytes")
        _check(self, "detect_s", "step_s", inclusive=True)
        _check(self, "commit_cores", optional=True)


@dataclass(frozen=True)
class Host:
    """One node's documented limits (bytes per second) and its cloud's notice."""

    name: str
    vcpus: int
    gpus: int  # the ranks of a node: one per GPU, each saving its shard
    network: float  # the NIC to the object store, as the CPU can drive it
    disk_write: float  # local checkpoint disk(s), all together
    notice_s: float
    store_name: str  # "S3" / "OSS"
    store_shared: float | None = None  # bandwidth the store allows the whole job (an account's, a bucket's)
    store_requests_per_s: float | None = None  # PUTs per second the job's prefix or bucket takes

    def __post_init__(self) -> None:
        _check(self, "vcpus", "gpus", "network", "disk_write", "notice_s")
        _check(self, "store_shared", "store_requests_per_s", optional=True)
        if self.vcpus // 2 <= self.gpus:
            raise ValueError(f"{self.name}: {self.vcpus} vCPUs leave no core for the commit beside {self.gpus} ranks")


@dataclass(frozen=True)
class Job:
    name: str
    checkpoint_bytes: float  # the whole checkpoint, every node's share together
    nodes: int = 1

    def __post_init__(self) -> None:
        _check(self, "checkpoint_bytes", "nodes")


@dataclass(frozen=True)
class Estimate:
    """Seconds for one node's share; ``bound`` names the term that sets ``durable_s``."""

    node_bytes: float
    physical_s: float
    save_cpu_s: float
    commit_cpu_s: float
    save_s: float
    upload_s: float
    durable_s: float
    notice_s: float
    bound: str

    @property
    def fits(self) -> bool:
        return self.durable_s <= self.notice_s


def estimate(host: Host, job: Job, measured: Measured) -> Estimate:
    size = job.checkpoint_bytes / job.nodes
    commit_cores = host.vcpus // 2 - host.gpus  # physical cores, less one per rank writing its shard
    if measured.commit_cores is not None:
        commit_cores = min(commit_cores, measured.commit_cores)
    save_cpu = host.gpus * GiB / measured.save_cpu_s_per_gib
    commit_cpu = commit_cores * GiB / measured.commit_cpu_s_per_gib
    network = {"network": host.network}
    if host.store_shared is not None:
        network[f"{host.store_name} share"] = host.store_shared / job.nodes
    if host.store_requests_per_s is not None:
        network[f"{host.store_name} requests"] = host.store_requests_per_s * measured.part_bytes / job.nodes
    net_bound = min(network, key=lambda name: network[name])
    save_rates = {"disk": host.disk_write, "save CPU": save_cpu}
    upload_rates = {net_bound: network[net_bound], "commit CPU": commit_cpu}
    save_bound = min(save_rates, key=lambda name: save_rates[name])
    upload_bound = min(upload_rates, key=lambda name: upload_rates[name])
    save_s = size / save_rates[save_bound]
    upload_s = size / upload_rates[upload_bound]
    return Estimate(
        node_bytes=size,
        physical_s=max(size / host.disk_write, size / network[net_bound]),
        save_cpu_s=size / save_cpu,
        commit_cpu_s=size / commit_cpu,
        save_s=save_s,
        upload_s=upload_s,
        durable_s=measured.detect_s + measured.step_s + measured.overlap * max(save_s, upload_s),
        notice_s=host.notice_s,
        bound=save_bound if save_s >= upload_s else upload_bound,
    )


def hosts(nvme_gbytes_per_s: float = 2.0, oss_upload_gbps: float = 20.0) -> list[Host]:
    """The three hosts of the docstring, with the two assumed or region-dependent figures as parameters."""
    for name, value in (("nvme_gbytes_per_s", nvme_gbytes_per_s), ("oss_upload_gbps", oss_upload_gbps)):
        if not math.isfinite(value) or value <= 0:
            raise ValueError(f"{name} must be a finite number > 0, not {value!r}")
    s3_prefix_puts = 3500.0
    return [
        Host("p5.48xlarge", 192, 8, gbps(400), 8 * nvme_gbytes_per_s * GB, 120, "S3", None, s3_prefix_puts),
        Host("p4d.24xlarge", 96, 8, gbps(400), 8 * nvme_gbytes_per_s * GB, 120, "S3", None, s3_prefix_puts),
        Host("ecs.ebmgn8v.48xlarge", 192, 8, gbps(170), gbps(6), 300, "OSS", gbps(oss_upload_gbps), 10_000.0),
    ]


JOBS = [
    Job("7B LoRA", 0.5 * GB),
    Job("7B full", 7e9 * 16),
    Job("70B LoRA x8", 2.5 * GB, nodes=8),
    Job("70B full x8", 70e9 * 16, nodes=8),
]


def _seconds(value: float) -> str:
    return f"{value:.2f} s" if value < 10 else f"{value:.1f} s"


def table(measured: Measured, host_list: Sequence[Host], jobs: Sequence[Job] = JOBS) -> str:
    lines = [
        f"{'host':<20} {'job':<11} {'GB/node':>7} {'notice':>6} {'physical':>8} {'CPU save/commit':>15}"
        f" {'save':>8} {'upload':>8} {'durable':>8} {'fits':<4} set by"
    ]
    for host in host_list:
        for job in jobs:
            e = estimate(host, job, measured)
            cpu = f"{_seconds(e.save_cpu_s)[:-2]} / {_seconds(e.commit_cpu_s)}"
            lines.append(
                f"{host.name:<20} {job.name:<11} {e.node_bytes / GB:>7.2f} {e.notice_s:>4.0f} s"
                f" {_seconds(e.physical_s):>8} {cpu:>15} {_seconds(e.save_s):>8} {_seconds(e.upload_s):>8}"
                f" {_seconds(e.durable_s):>8} {'yes' if e.fits else 'NO':<4} {e.bound}"
            )
    return "\n".join(lines)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        """One line and exit 2, no usage block."""
        self.exit(2, f"notice_model: {message}\n")


def main(argv: Sequence[str] | None = None) -> int:
    parser = _Parser(description=__doc__.split("\n", 1)[0])
    defaults = Measured()
    parser.add_argument("--save-cpu-s-per-gib", type=float, default=defaults.save_cpu_s_per_gib)
    parser.add_argument("--commit-cpu-s-per-gib", type=float, default=defaults.commit_cpu_s_per_gib)
    parser.add_argument("--overlap", type=float, default=defaults.overlap)
    parser.add_argument("--detect-seconds", type=float, default=defaults.detect_s)
    parser.add_argument("--step-seconds", type=float, default=defaults.step_s)
    parser.add_argument("--part-mib", type=float, default=defaults.part_bytes / MiB)
    parser.add_argument("--commit-cores", type=int, default=defaults.commit_cores, help="cap the commit's cores")
    parser.add_argument("--nvme-gbytes-per-s", type=float, default=2.0, help="one NVMe drive's write (assumed)")
    parser.add_argument("--oss-upload-gbps", type=float, default=20.0, help="the account's OSS upload in the region")
    args = parser.parse_args(argv)
    try:
        measured = replace(
            defaults,
            save_cpu_s_per_gib=args.save_cpu_s_per_gib,
            commit_cpu_s_per_gib=args.commit_cpu_s_per_gib,
            overlap=args.overlap,
            detect_s=args.detect_seconds,
            step_s=args.step_seconds,
            part_bytes=round(args.part_mib * MiB) if math.isfinite(args.part_mib) else args.part_mib,
            commit_cores=args.commit_cores,
        )
        host_list = hosts(args.nvme_gbytes_per_s, args.oss_upload_gbps)
    except ValueError as error:
        parser.error(str(error))
    print(table(measured, host_list))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""bench/notice_model.py: its arithmetic on one case worked by hand, and the inputs it refuses."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from bench import notice_model
from bench.notice_model import GiB, Host, Job, Measured, MiB, estimate, main

# By hand: 16 GiB over 2 nodes is 8 GiB a node. Two ranks at 0.5 CPU-s/GiB save 4 GiB/s; the disk writes 2 GiB/s,
# so the save takes 8 / 2 = 4 s (disk). 12 vCPUs are 6 cores, 4 once the two ranks have theirs: at 1 CPU-s/GiB the
# commit's CPU sends 4 GiB/s. The network: the NIC 1 GiB/s, the store's shared 4 GiB/s halved per node (2 GiB/s),
# 100 PUTs/s of 16 MiB halved (0.78125 GiB/s): the requests bind, 8 / 0.78125 = 10.24 s to upload.
# Durable: 0.5 s detection + 1.5 s step + 1.25 × max(4, 10.24) = 14.8 s, inside a 15 s notice.
HOST = Host(
    "hand",
    vcpus=12,
    gpus=2,
    network=1 * GiB,
    disk_write=2 * GiB,
    notice_s=15,
    store_name="S",
    store_shared=4 * GiB,
    store_requests_per_s=100,
)
JOB = Job("hand", 16 * GiB, nodes=2)
MEASURED = Measured(
    save_cpu_s_per_gib=0.5, commit_cpu_s_per_gib=1.0, overlap=1.25, detect_s=0.5, step_s=1.5, part_bytes=16 * MiB
)


def test_one_case_by_hand() -> None:
    e = estimate(HOST, JOB, MEASURED)
    assert e.node_bytes == 8 * GiB
    assert e.save_s == pytest.approx(4.0)
    assert e.upload_s == pytest.approx(10.24)
    assert e.physical_s == pytest.approx(10.24)  # max(disk 4 s, network 10.24 s)
    assert e.save_cpu_s == pytest.approx(2.0)
    assert e.commit_cpu_s == pytest.approx(2.0)
    assert e.durable_s == pytest.approx(14.8)
    assert e.bound == "S requests"
    assert e.fits
    assert estimate(HOST, JOB, replace(MEASURED, commit_cores=1)).commit_cpu_s == pytest.approx(8.0)  # 1 GiB/s
    tighter = estimate(replace(HOST, notice_s=14), JOB, MEASURED)
    assert not tighter.fits


def test_the_commit_cpu_binds_when_the_cores_are_few() -> None:
    # 6 vCPUs: 3 cores, 1 after the two ranks: 1 GiB/s of commit at 1 CPU-s/GiB, 8 s, the network at 2 GiB/s 4 s.
    host = Host("few", vcpus=6, gpus=2, network=2 * GiB, disk_write=8 * GiB, notice_s=60, store_name="S")
    e = estimate(host, JOB, MEASURED)
    assert e.upload_s == pytest.approx(8.0)
    assert e.physical_s == pytest.approx(4.0)
    assert e.bound == "commit CPU"


@pytest.mark.parametrize(
    "make",
    [
        lambda: Measured(commit_cpu_s_per_gib=0),
        lambda: Measured(save_cpu_s_per_gib=-1),
        lambda: Measured(overlap=0.9),
        lambda: Measured(step_s=math.nan),
        lambda: Measured(commit_cores=0),
        lambda: Host("h", vcpus=16, gpus=8, network=1, disk_write=1, notice_s=120, store_name="S"),
        lambda: Host("h", vcpus=192, gpus=8, network=math.inf, disk_write=1, notice_s=120, store_name="S"),
        lambda: Host("h", vcpus=192, gpus=8, network=1, disk_write=1, notice_s=120, store_name="S", store_shared=0),
        lambda: Job("j", 1e9, nodes=0),
    ],
)
def test_bad_inputs_are_refused(make: object) -> None:
    with pytest.raises(ValueError):
        make()  # type: ignore[operator]


def test_the_command_line_refuses_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["--overlap", "0.5"], ["--nvme-gbytes-per-s", "-1"], ["--part-mib", "nan"], ["--step-seconds", "x"]):
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        assert exit_.value.code == 2
        captured = capsys.readouterr()
        assert captured.out == ""
        assert captured.err.startswith("notice_model: ") and captured.err.count("\n") == 1, captured.err


def test_the_command_line_takes_new_measured_figures(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 0
    default = capsys.readouterr().out
    assert main(["--commit-cpu-s-per-gib", "3", "--commit-cores", "40"]) == 0
    slower = capsys.readouterr().out
    p4d_full = [line for line in slower.splitlines() if line.startswith("p4d.24xlarge") and "7B full" in line]
    assert p4d_full and "7.82 / 7.82 s" in p4d_full[0]  # the commit's CPU on p4d's 40 free cores as slow as the save
    assert default != slower


def test_a_shared_store_limit_is_split_among_the_nodes() -> None:
    # The account's 2 GiB/s over 2 nodes: 1 GiB/s a node, 8 s for 8 GiB, though each NIC sends 4 GiB/s.
    host = replace(HOST, network=4 * GiB, store_shared=2 * GiB, store_requests_per_s=None, notice_s=60)
    e = estimate(host, JOB, MEASURED)
    assert e.upload_s == pytest.approx(8.0)
    assert e.bound == "S share"
    assert estimate(host, Job("one node", 8 * GiB), MEASURED).upload_s == pytest.approx(4.0)


def test_the_recorded_table_is_what_the_defaults_print() -> None:
    # The docstring (and docs/benchmarks.md, copied from it) records the defaults' table: a changed input changes both.
    assert notice_model.__doc__ is not None
    recorded = notice_model.__doc__.split("Recorded (defaults)::\n\n", 1)[1].split("\n\n", 1)[0]
    printed = notice_model.table(Measured(), notice_model.hosts())
    assert [line.strip() for line in recorded.splitlines()] == [line.strip() for line in printed.splitlines()]


def test_the_commit_gets_no_more_cores_than_its_send_lanes() -> None:
    # 48 vCPUs: 24 cores, 22 after the two ranks; the store sends on 8 lanes, so the commit's CPU sends 8 GiB/s at
    # 1 CPU-s/GiB: 1 s for the node's 8 GiB (22 cores would be 0.36 s).
    host = replace(HOST, vcpus=48)
    assert Measured().commit_cores == 8
    assert estimate(host, JOB, replace(MEASURED, commit_cores=8)).commit_cpu_s == pytest.approx(1.0)
    assert estimate(host, JOB, replace(MEASURED, commit_cores=None)).commit_cpu_s == pytest.approx(8 / 22)

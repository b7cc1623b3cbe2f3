"""A gang of two nodes as one world: two real runner processes on loopback, each with its own work directory and
metadata endpoint, gloo between their tiny trainers, moto S3 as the store.

Node 1 gets a spot notice: both nodes stop after the same step and save it, each commits its part, node 0's runner
writes GANG.json, and node 0 stands by instead of exiting. A regroup in its control object (as the bot writes it)
and a fresh runner for the replacement node 1 resume the next generation from that step, and the final adapter is
bitwise the one of an uninterrupted two-node run. Cost: one uninterrupted two-node run without the runner, and one
interrupted and resumed through the runners (two trainers, one rank each, at a time).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from bot.cloud.local.metadata import LocalMetadataServer
from fakes.ports import free_port
from handlers.spec import Gang, RegroupControl, dump_control, node_control_key
from tests.gang_reference import ADAPTER, GANG_STEPS
from tests.runner_harness import (
    of_type,
    progress_steps,
    read_reports,
    runner_env,
    same_tensors,
    start_runner,
    wait_for_report,
    wait_until,
    write_spec,
)

BUCKET = "gang-bucket"
PREFIX = "jobs/ft-gang/"
URI = f"s3://{BUCKET}/{PREFIX}"
STEPS = GANG_STEPS  # compared with conftest's two_node_reference
pytestmark = pytest.mark.timeout(900)


def gang(node_rank: int, generation: int, port: int) -> Gang:
    return Gang(nodes=2, node_rank=node_rank, generation=generation, master_addr="127.0.0.1", master_port=port)


@pytest.fixture
def s3(aws: str) -> Iterator[Any]:
    client = boto3.client("s3", endpoint_url=aws)
    client.create_bucket(Bucket=BUCKET)
    yield client


@pytest.fixture
async def imds_for() -> AsyncIterator[Any]:
    """One metadata endpoint per instance of the gang (each node its own, as on a cloud)."""
    servers: list[LocalMetadataServer] = []

    async def start(instance_id: str) -> LocalMetadataServer:
        server = await LocalMetadataServer(instance_id=instance_id).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        await server.stop()


def keys(s3: Any) -> list[str]:
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=PREFIX)
    return [item["Key"][len(PREFIX) :] for page in pages for item in page.get("Contents", [])]


def node_spec(path: Path, reports: Path, member: Gang, step_seconds: str = "0.25") -> Path:
    return write_spec(
        path,
        job_id="ft-gang",
        checkpoint_uri=URI,
        report=[f"file://{reports}"],
        notice="aws",
        command=[sys.executable, "-m", "runner.hf.tiny", *STEPS, "--step-seconds", step_seconds],
        gang=member.model_dump(),
    )


async def test_a_notice_on_node_1_stops_both_at_one_step_and_a_replacement_resumes_bitwise_equal(
    tmp_path: Path, aws: str, s3: Any, imds_for: Any, two_node_reference: bytes
) -> None:
    node0, node1, spare = [await imds_for(name) for name in ("i-0node0", "i-0node1", "i-0node1b")]
    reports0, reports1, reports2 = (tmp_path / f"reports-{name}.jsonl" for name in ("n0", "n1", "n1b"))
    first_port, second_port = free_port(), free_port()
    env = {"AWS_ENDPOINT_URL": aws, "FINETUNE_COLLECTIVE_TIMEOUT_SECONDS": "120"}
    runner0 = await start_runner(
        node_spec(tmp_path / "n0.json", reports0, gang(0, 1, first_port)),
        tmp_path / "n0",
        runner_env(**env, AWS_EC2_METADATA_SERVICE_ENDPOINT=node0.endpoint),
    )
    runner1 = await start_runner(
        node_spec(tmp_path / "n1.json", reports1, gang(1, 1, first_port)),
        tmp_path / "n1",
        runner_env(**env, AWS_EC2_METADATA_SERVICE_ENDPOINT=node1.endpoint),
    )

    # checkpoint-5 counts (both parts and the marker) before the notice: the notice path then knows its upload rate.
    saved = await wait_for_report(reports0, lambda r: r["type"] == "checkpoint_saved", timeout=400)
    assert saved["step"] == 5 and saved["node_rank"] == 0 and saved["generation"] == 1
    assert {"checkpoint-5/GANG.json", "checkpoint-5/node-0/MANIFEST.json", "checkpoint-5/node-1/MANIFEST.json"} <= set(
        keys(s3)
    )
    await wait_for_report(reports1, lambda r: r["type"] == "progress" and r["step"] >= 7)  # node 1 reports too
    node1.interrupt(seconds=120)
    assert await asyncio.wait_for(runner1.wait(), 300) == 75

    [interrupted] = of_type(read_reports(reports1), "interrupted")
    stopped = interrupted["step"]
    assert interrupted["node_rank"] == 1 and interrupted["saved_in_time"] is True and 7 <= stopped < 16
    standby = await wait_for_report(reports0, lambda r: r["type"] == "standby", timeout=300)
    assert standby["node_rank"] == 0 and standby["generation"] == 1
    assert standby["step"] == stopped and standby["cause"] == "stopped"  # the same step, every part committed
    assert runner0.returncode is None  # node 0 keeps its instance
    stored = set(keys(s3))
    assert {f"checkpoint-{stopped}/node-0/{ADAPTER}", f"checkpoint-{stopped}/node-0/rng_state_0.pth"} <= stored
    assert f"checkpoint-{stopped}/node-1/rng_state_1.pth" in stored
    marker = json.loads(s3.get_object(Bucket=BUCKET, Key=f"{PREFIX}checkpoint-{stopped}/GANG.json")["Body"].read())
    assert (marker["nodes"], marker["generation"], marker["step"], sorted(marker["parts"])) == (
        2,
        1,
        stopped,
        ["node-0", "node-1"],
    )
    # Neither node trained past the agreed step.
    assert progress_steps(tmp_path / "n0" / "progress.jsonl")[-1] == stopped
    assert progress_steps(tmp_path / "n1" / "progress.jsonl")[-1] == stopped

    # The bot's side: the next generation, node 0 told in its own control object, a replacement for node 1.
    regroup = RegroupControl(gang=gang(0, 2, second_port))
    s3.put_object(Bucket=BUCKET, Key=PREFIX + node_control_key(1, 1, 0), Body=dump_control(regroup))
    runner2 = await start_runner(
        node_spec(tmp_path / "n1b.json", reports2, gang(1, 2, second_port), step_seconds="0"),
        tmp_path / "n1b",
        runner_env(**env, AWS_EC2_METADATA_SERVICE_ENDPOINT=spare.endpoint),
    )
    assert await asyncio.wait_for(runner2.wait(), 400) == 0
    assert await asyncio.wait_for(runner0.wait(), 120) == 0

    again = [r for r in of_type(read_reports(reports0), "started") if r["generation"] == 2]
    assert [(r["resumed_from_step"], r["node_rank"]) for r in again] == [(stopped, 0)]
    [replacement] = of_type(read_reports(reports2), "started")
    assert (replacement["resumed_from_step"], replacement["generation"]) == (stopped, 2)
    assert progress_steps(tmp_path / "n1b" / "progress.jsonl")[0] == stopped + 1  # 0 steps lost, none twice
    [completed] = of_type(read_reports(reports0), "completed")
    assert completed["step"] == 16
    final = s3.get_object(Bucket=BUCKET, Key=f"{PREFIX}output/{ADAPTER}")["Body"].read()
    assert same_tensors(final, two_node_reference)
    assert final == two_node_reference


async def test_a_node_lost_without_a_notice_leaves_the_other_standing_by_with_the_step_it_held(
    tmp_path: Path, aws: str, s3: Any, imds_for: Any, two_node_reference: bytes
) -> None:
    node0, node1, spare = [await imds_for(name) for name in ("i-0node0", "i-0node1", "i-0node1b")]
    reports0, reports2 = tmp_path / "reports-n0.jsonl", tmp_path / "reports-n1b.jsonl"
    first_port, second_port = free_port(), free_port()
    env = {"AWS_ENDPOINT_URL": aws, "FINETUNE_COLLECTIVE_TIMEOUT_SECONDS": "30"}
    runner0 = await start_runner(
        node_spec(tmp_path / "n0.json", reports0, gang(0, 1, first_port)),
        tmp_path / "n0",
        runner_env(**env, AWS_EC2_METADATA_SERVICE_ENDPOINT=node0.endpoint),
    )
    runner1 = await start_runner(
        node_spec(tmp_path / "n1.json", tmp_path / "reports-n1.jsonl", gang(1, 1, first_port)),
        tmp_path / "n1",
        runner_env(**env, AWS_EC2_METADATA_SERVICE_ENDPOINT=node1.endpoint),
        new_session=True,
    )
    saved = await wait_for_report(reports0, lambda r: r["type"] == "checkpoint_saved", timeout=400)
    # Past that save, so that node 0 holds a step whose node-1 part nobody committed (the part is rebuilt by rule).
    await wait_until(lambda: any(step > saved["step"] for step in progress_steps(tmp_path / "n0" / "progress.jsonl")))
    os.killpg(runner1.pid, signal.SIGKILL)  # the instance is gone: no notice, nothing runs after
    await runner1.wait()

    said = await wait_for_report(reports0, lambda r: r["type"] == "standby", timeout=300)
    assert said["cause"] == "peer-lost" and said["exit_code"] != 0 and said["step"] is None  # at once: it broke
    standby = await wait_for_report(
        reports0, lambda r: r["type"] == "standby" and r["cause"] == "trainer-exited", timeout=300
    )
    marked = sorted(int(key.split("/")[0].split("-")[1]) for key in keys(s3) if key.endswith("/GANG.json"))
    assert standby["step"] == marked[-1] >= 5  # the step its trainer held, committed as the gang's checkpoint
    assert standby["rebuilt"] == {"node-1": "seed-step-rank"}  # node 1's part: its RNG derived by rule
    assert progress_steps(tmp_path / "n0" / "progress.jsonl")[-1] <= standby["step"]  # no step it trained lost
    assert runner0.returncode is None

    s3.put_object(
        Bucket=BUCKET,
        Key=PREFIX + node_control_key(1, 1, 0),
        Body=dump_control(RegroupControl(gang=gang(0, 2, second_port))),
    )
    runner2 = await start_runner(
        node_spec(tmp_path / "n1b.json", reports2, gang(1, 2, second_port), step_seconds="0"),
        tmp_path / "n1b",
        runner_env(**env, AWS_EC2_METADATA_SERVICE_ENDPOINT=spare.endpoint),
    )
    assert await asyncio.wait_for(runner2.wait(), 400) == 0
    assert await asyncio.wait_for(runner0.wait(), 120) == 0
    [replacement] = of_type(read_reports(reports2), "started")
    assert replacement["resumed_from_step"] == standby["step"]
    final = s3.get_object(Bucket=BUCKET, Key=f"{PREFIX}output/{ADAPTER}")["Body"].read()
    assert final == two_node_reference


async def test_node_0_tells_its_interruption_only_once_every_nodes_part_of_the_step_is_marked(
    tmp_path: Path, aws: str, s3: Any, imds_for: Any
) -> None:
    """Node 0's ``interrupted`` report names the step every node resumes from; the bot may release every node on
    it (a stop, the whole gang lost), so the marker of that step comes first, as node 0's ``checkpoint_saved``."""
    node0, node1 = [await imds_for(name) for name in ("i-0node0", "i-0node1")]
    reports0 = tmp_path / "reports-n0.jsonl"
    port = free_port()
    env = {"AWS_ENDPOINT_URL": aws, "FINETUNE_COLLECTIVE_TIMEOUT_SECONDS": "120"}
    runner0 = await start_runner(
        node_spec(tmp_path / "n0.json", reports0, gang(0, 1, port)),
        tmp_path / "n0",
        runner_env(**env, AWS_EC2_METADATA_SERVICE_ENDPOINT=node0.endpoint),
    )
    runner1 = await start_runner(
        node_spec(tmp_path / "n1.json", tmp_path / "reports-n1.jsonl", gang(1, 1, port)),
        tmp_path / "n1",
        runner_env(**env, AWS_EC2_METADATA_SERVICE_ENDPOINT=node1.endpoint),
        new_session=True,
    )
    try:
        await wait_for_report(reports0, lambda r: r["type"] == "progress" and r["step"] >= 7, timeout=400)
        node0.interrupt(seconds=120)
        assert await asyncio.wait_for(runner0.wait(), 300) == 75
        told = read_reports(reports0)
        [interrupted] = of_type(told, "interrupted")
        stopped = interrupted["step"]
        assert interrupted["saved_in_time"] is True and stopped >= 7
        saved = [n for n, r in enumerate(told) if r["type"] == "checkpoint_saved" and r["step"] == stopped]
        assert saved and saved[0] < told.index(interrupted)  # marked, then told
        assert f"checkpoint-{stopped}/GANG.json" in keys(s3)
    finally:
        if runner1.returncode is None:
            os.killpg(runner1.pid, signal.SIGKILL)  # node 1 stands by for a regroup that this test never sends
            await runner1.wait()

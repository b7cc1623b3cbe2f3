"""A sharded full fine-tune through the real runner: ``tiny tuner=full sharded=true nproc=2`` (FSDP2 on gloo, CPU).

Each rank writes its own shard of the weights and of the AdamW state through ``torch.distributed.checkpoint``,
rank 0 the metadata. A notice mid-run: both ranks agree on the step, save it, and the runner commits both shards and
the metadata as one checkpoint; a fresh runner restores them all and the final weights are bitwise those of an
uninterrupted two-rank run. The ranks are frozen (SIGSTOP) from the moment rank 0 reported a step until the runner
has written its stop request, so the step they stop at does not depend on timing. Cost: three two-rank runs.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from bot.cloud.local.metadata import LocalMetadataServer
from fakes.ports import free_port
from handlers.jobs import Job
from handlers.recipes import TINY
from handlers.spec import Gang, RegroupControl, dump_control, node_control_key
from handlers.spec_build import build_spec
from tests.gang_reference import two_node_adapter
from tests.runner_harness import (
    made_once,
    of_type,
    progress_steps,
    read_reports,
    runner_env,
    same_tensors,
    start_runner,
    wait_for_report,
    write_spec,
)
from tests.test_torchrun_trainer import freeze_ranks, until

STEPS = 12  # 8 steps per epoch (64 sequences, 4 per rank, 2 ranks): into the second epoch
OVERRIDES = {
    "steps": str(STEPS),
    "save_steps": "5",
    "nproc": "2",
    "step_seconds": "0.25",
    "tuner": "full",
    "sharded": "true",
    "lr": "0.01",
}
WEIGHTS = "model.safetensors"
SHARDED_CHECKPOINT = {".metadata", "__0_0.distcp", "__1_0.distcp", "trainer_state.json"}
"""What a step's checkpoint holds: DCP's metadata (rank 0), each rank's shard, and the step."""

pytestmark = pytest.mark.timeout(900)


def sharded_spec(path: Path, store: Path, reports: Path, attempt: int) -> Path:
    """The spec the bot sends for ``/finetune start tiny tuner=full sharded=true nproc=2 …``."""
    job = Job(id="ft-sharded", recipe=TINY.name, params=TINY.resolve(OVERRIDES), requested_by="console:test")
    spec = build_spec(job, attempt, TINY, f"file://{store}/", [f"file://{reports}"], "aws", sys.executable)
    path.write_text(spec.model_dump_json())
    return path


def run_uninterrupted(root: Path, resume_from: Path | None = None) -> None:
    """The same command without the runner and without waiting between steps: its final weights in ``root``."""
    job = Job(id="ft-sharded", recipe=TINY.name, params=TINY.resolve(OVERRIDES), requested_by="console:test")
    command = build_spec(job, 1, TINY, "file:///unused/", [], "none", sys.executable).command
    command[command.index("--step-seconds") + 1] = "0"
    command = [sys.executable if item == "${FINETUNE_PYTHON}" else item for item in command]
    with tempfile.TemporaryDirectory(prefix="shards-") as scratch:  # short: Unix socket paths stay in 108 bytes
        env = dict(os.environ, FINETUNE_OUTPUT_DIR=str(root), FINETUNE_RESUME_FROM=str(resume_from or ""))
        env.update(HF_HUB_OFFLINE="1")
        env.update(TMPDIR=scratch)
        env.pop("FINETUNE_STOP_FILE", None)
        run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """The final weights of the uninterrupted two-rank run, made once."""
    return (made_once(tmp_path_factory, "sharded-reference", run_uninterrupted) / WEIGHTS).read_bytes()


@pytest.mark.scenario  # its fixture runs the trainer
def test_a_background_save_holds_the_step_it_was_asked_for_while_training_went_on(
    tmp_path: Path, reference: bytes, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """checkpoint-10 of the reference run was written by ``async_save`` while the ranks trained on without a pause
    (no step delay): resumed from it, a fresh run ends bitwise equal, so the background save took a copy of step 10
    and nothing of the steps after it."""
    periodic = made_once(tmp_path_factory, "sharded-reference", run_uninterrupted) / "checkpoint-10"
    assert (periodic / ".finetune-complete").exists()
    assert json.loads((periodic / "trainer_state.json").read_text()) == {"global_step": 10}
    run_uninterrupted(tmp_path / "resumed", resume_from=periodic)
    assert (tmp_path / "resumed" / WEIGHTS).read_bytes() == reference


async def test_a_notice_waits_for_the_background_save_in_flight_then_saves_its_own_step(
    tmp_path: Path, imds: LocalMetadataServer
) -> None:
    """``--hold-saves`` keeps checkpoint-12's background save in flight until the ranks wait for it, so the notice
    always finds it unfinished: the stop finishes and marks it first, then saves the step the ranks reached, which
    the runner commits."""
    store, reports, work = tmp_path / "store", tmp_path / "reports.jsonl", tmp_path / "a1"
    arguments = ["--max-steps", "48", "--save-steps", "12", "--lr", "0.01", "--tuner", "full", "--sharded", "true"]
    command = [sys.executable, "-m", "runner.hf.tiny", *arguments, "--processes", "2", "--step-seconds", "0.25"]
    spec = write_spec(
        tmp_path / "a1.json",
        job_id="ft-held",
        checkpoint_uri=f"file://{store}/",
        report=[f"file://{reports}"],
        notice="aws",
        command=[*command, "--hold-saves"],
    )
    env = runner_env(AWS_EC2_METADATA_SERVICE_ENDPOINT=imds.endpoint, FINETUNE_SYNC_SECONDS="600")
    runner = await start_runner(spec, work, env)
    ranks = await freeze_ranks(runner, work / "progress.jsonl", 13)  # past checkpoint-12's start, before step 24's
    assert progress_steps(work / "progress.jsonl")[-1] < 24
    periodic = work / "output" / "checkpoint-12"
    assert not (periodic / ".finetune-complete").exists()  # held in flight
    imds.interrupt(seconds=120)
    await until(lambda: (work / "stop-request").exists())
    for rank in ranks:
        os.kill(rank, signal.SIGCONT)
    assert await asyncio.wait_for(runner.wait(), 180) == 75

    [interrupted] = of_type(read_reports(reports), "interrupted")
    reached = progress_steps(work / "progress.jsonl")[-1]
    assert interrupted["saved_in_time"] is True and 13 <= interrupted["step"] == reached < 24
    # The save in flight was finished and marked, not abandoned, before the stop's own save.
    assert {path.name for path in periodic.iterdir()} == SHARDED_CHECKPOINT | {".finetune-complete"}
    manifest = json.loads((store / f"checkpoint-{reached}" / "MANIFEST.json").read_text())
    assert {item["path"] for item in manifest["files"]} == SHARDED_CHECKPOINT


def run_full(output: Path, resume_from: Path | None = None) -> None:
    """``tiny tuner=full`` without ``sharded``: one process, the Hugging Face ``Trainer``, 7 steps, saves every 5."""
    command = [sys.executable, "-m", "runner.hf.tiny", "--max-steps", "7", "--save-steps", "5", "--lr", "0.01"]
    env = dict(os.environ, FINETUNE_OUTPUT_DIR=str(output), FINETUNE_RESUME_FROM=str(resume_from or ""))
    env.update(HF_HUB_OFFLINE="1")
    env.pop("FINETUNE_STOP_FILE", None)
    run = subprocess.run([*command, "--tuner", "full"], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]


@pytest.mark.scenario  # runs the trainer
def test_a_full_fine_tune_saves_every_weight_and_the_optimizer_and_resumes_bitwise_equal(tmp_path: Path) -> None:
    run_full(tmp_path / "whole")
    reference = (tmp_path / "whole" / WEIGHTS).read_bytes()
    saved = tmp_path / "whole" / "checkpoint-5"
    assert {WEIGHTS, "optimizer.pt", "scheduler.pt", "rng_state.pth", ".finetune-complete"} <= {
        path.name for path in saved.iterdir()
    }
    assert not (saved / "adapter_model.safetensors").exists()  # no adapter: the whole model trains
    run_full(tmp_path / "resumed", resume_from=saved)
    assert (tmp_path / "resumed" / WEIGHTS).read_bytes() == reference
    # Resumed from the last step's checkpoint: nothing left to train, its weights are the final output.
    run_full(tmp_path / "last", resume_from=tmp_path / "whole" / "checkpoint-7")
    assert same_tensors((tmp_path / "last" / WEIGHTS).read_bytes(), reference)


@pytest.fixture
async def imds() -> AsyncIterator[LocalMetadataServer]:
    server = await LocalMetadataServer(instance_id="i-0shards").start()
    yield server
    await server.stop()


async def test_two_ranks_commit_their_shards_as_one_checkpoint_on_notice_and_resume_bitwise_equal(
    tmp_path: Path, imds: LocalMetadataServer, reference: bytes
) -> None:
    store, reports, work = tmp_path / "store", tmp_path / "reports.jsonl", tmp_path / "a1"
    env = runner_env(AWS_EC2_METADATA_SERVICE_ENDPOINT=imds.endpoint, FINETUNE_SYNC_SECONDS="600")
    first = await start_runner(sharded_spec(tmp_path / "a1.json", store, reports, 1), work, env)
    ranks = await freeze_ranks(first, work / "progress.jsonl", 6)
    frozen_at = progress_steps(work / "progress.jsonl")[-1]
    imds.interrupt(seconds=120)
    await until(lambda: (work / "stop-request").exists())
    for rank in ranks:
        os.kill(rank, signal.SIGCONT)
    assert await asyncio.wait_for(first.wait(), 180) == 75

    [interrupted] = of_type(read_reports(reports), "interrupted")
    reached = progress_steps(work / "progress.jsonl")[-1]
    assert interrupted["saved_in_time"] is True
    assert interrupted["step"] == reached and frozen_at <= reached <= frozen_at + 1 < STEPS
    # Both ranks' shards and rank 0's metadata, committed as one checkpoint (one manifest vouching for them all).
    committed = store / f"checkpoint-{reached}"
    manifest = json.loads((committed / "MANIFEST.json").read_text())
    assert {item["path"] for item in manifest["files"]} == SHARDED_CHECKPOINT
    assert {path.name for path in committed.iterdir()} == SHARDED_CHECKPOINT | {"MANIFEST.json"}
    assert json.loads((committed / "trainer_state.json").read_text()) == {"global_step": reached}
    shards = [(committed / name).stat().st_size for name in ("__0_0.distcp", "__1_0.distcp")]
    assert min(shards) > 100_000  # each rank's slice of the weights and of the AdamW state, not an empty file
    # The periodic save went through DCP's background save and was marked complete too.
    periodic = work / "output" / "checkpoint-5"
    assert {path.name for path in periodic.iterdir()} == SHARDED_CHECKPOINT | {".finetune-complete"}
    assert max(int(p.name.split("-")[1]) for p in (work / "output").glob("checkpoint-*")) == reached

    imds.interruption = None
    second = await start_runner(sharded_spec(tmp_path / "a2.json", store, reports, 2), tmp_path / "a2", env)
    assert await asyncio.wait_for(second.wait(), 300) == 0
    attempt2 = [r for r in read_reports(reports) if r["attempt"] == 2]
    assert of_type(attempt2, "started")[0]["resumed_from_step"] == reached
    assert progress_steps(tmp_path / "a2" / "progress.jsonl")[0] == reached + 1
    assert of_type(attempt2, "completed")[0]["step"] == STEPS
    final = (store / "output" / WEIGHTS).read_bytes()
    assert same_tensors(final, reference)
    assert final == reference


GANG_STEPS = ["--max-steps", "20", "--save-steps", "5", "--lr", "0.01", "--tuner", "full", "--sharded", "true"]
BUCKET = "sharded-gang"
PREFIX = "jobs/ft-shards/"


def gang(node_rank: int, generation: int, port: int) -> Gang:
    return Gang(nodes=2, node_rank=node_rank, generation=generation, master_addr="127.0.0.1", master_port=port)


def node_spec(path: Path, reports: Path, member: Gang, step_seconds: str = "0.25") -> Path:
    return write_spec(
        path,
        job_id="ft-shards",
        checkpoint_uri=f"s3://{BUCKET}/{PREFIX}",
        report=[f"file://{reports}"],
        notice="aws",
        command=[sys.executable, "-m", "runner.hf.tiny", *GANG_STEPS, "--step-seconds", step_seconds],
        gang=member.model_dump(),
    )


@pytest.fixture(scope="module")
def gang_reference(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """The final weights of an uninterrupted two-node sharded run (one rank per node, one world), made once."""
    root = made_once(
        tmp_path_factory, "sharded-gang-reference", lambda root: two_node_adapter(root, GANG_STEPS, WEIGHTS)
    )
    return (root / "node-0" / WEIGHTS).read_bytes()


@pytest.fixture
async def imds_for() -> AsyncIterator[Any]:
    servers: list[LocalMetadataServer] = []

    async def start(instance_id: str) -> LocalMetadataServer:
        server = await LocalMetadataServer(instance_id=instance_id).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        await server.stop()


async def test_a_gang_commits_each_nodes_shards_as_its_part_and_a_replacement_resumes_bitwise_equal(
    tmp_path: Path, aws: str, imds_for: Any, gang_reference: bytes
) -> None:
    s3 = boto3.client("s3", endpoint_url=aws)
    s3.create_bucket(Bucket=BUCKET)

    def keys() -> set[str]:
        pages = s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=PREFIX)
        return {item["Key"][len(PREFIX) :] for page in pages for item in page.get("Contents", [])}

    node0, node1, spare = [await imds_for(name) for name in ("i-0shard0", "i-0shard1", "i-0shard1b")]
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
    # The periodic (background) save of step 5 counts once both nodes' parts are in: the notice knows its rate.
    saved = await wait_for_report(reports0, lambda r: r["type"] == "checkpoint_saved", timeout=400)
    assert saved["step"] == 5
    await wait_for_report(reports1, lambda r: r["type"] == "progress" and r["step"] >= 7)
    node1.interrupt(seconds=120)
    assert await asyncio.wait_for(runner1.wait(), 300) == 75

    [interrupted] = of_type(read_reports(reports1), "interrupted")
    stopped = interrupted["step"]
    assert interrupted["saved_in_time"] is True and 7 <= stopped < 20
    standby = await wait_for_report(reports0, lambda r: r["type"] == "standby", timeout=300)
    assert standby["step"] == stopped and standby["cause"] == "stopped"
    # Each node's shard is its part: rank 0's with the metadata, rank 1's alone; GANG.json makes them one checkpoint.
    stored = {key for key in keys() if key.startswith(f"checkpoint-{stopped}/")}
    assert stored == {
        f"checkpoint-{stopped}/GANG.json",
        *(f"checkpoint-{stopped}/node-0/{name}" for name in (".metadata", "__0_0.distcp", "trainer_state.json")),
        *(f"checkpoint-{stopped}/node-1/{name}" for name in ("__1_0.distcp", "trainer_state.json")),
        f"checkpoint-{stopped}/node-0/MANIFEST.json",
        f"checkpoint-{stopped}/node-1/MANIFEST.json",
    }

    regroup = RegroupControl(gang=gang(0, 2, second_port))
    s3.put_object(Bucket=BUCKET, Key=PREFIX + node_control_key(1, 1, 0), Body=dump_control(regroup))
    runner2 = await start_runner(
        node_spec(tmp_path / "n1b.json", reports2, gang(1, 2, second_port), step_seconds="0"),
        tmp_path / "n1b",
        runner_env(**env, AWS_EC2_METADATA_SERVICE_ENDPOINT=spare.endpoint),
    )
    assert await asyncio.wait_for(runner2.wait(), 400) == 0
    assert await asyncio.wait_for(runner0.wait(), 120) == 0
    [replacement] = of_type(read_reports(reports2), "started")
    assert (replacement["resumed_from_step"], replacement["generation"]) == (stopped, 2)
    # The replacement restored the union of the parts: both shards and the metadata, in one checkpoint folder.
    restored = tmp_path / "n1b" / "output" / f"checkpoint-{stopped}"
    assert {".metadata", "__0_0.distcp", "__1_0.distcp"} <= {path.name for path in restored.iterdir()}
    assert progress_steps(tmp_path / "n1b" / "progress.jsonl")[0] == stopped + 1
    final = s3.get_object(Bucket=BUCKET, Key=f"{PREFIX}output/{WEIGHTS}")["Body"].read()
    assert same_tensors(final, gang_reference)
    assert final == gang_reference

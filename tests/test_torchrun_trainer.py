"""torchrun with two ranks (gloo, CPU): the bot's ``tiny`` recipe with ``nproc=2``, through the real runner.

The notice reaches both ranks through the stop file, they agree on the step (an all-reduce), both save that step
(each its own RNG state, rank 0 the rest and then the marker) and exit: no hang. The ranks are frozen (SIGSTOP)
from the moment rank 0 reported a step until the runner has written its stop request, so which step they stop at
does not depend on timing. A fresh runner resumes there and
its final adapter is bitwise the one of an uninterrupted two-rank run. Cost: three two-rank runs, ~15-25 s each.
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bot.cloud.local.metadata import LocalMetadataServer
from handlers.jobs import Job
from handlers.recipes import TINY
from handlers.spec_build import build_spec
from tests.runner_harness import child_pids, made_once, of_type, progress_steps, read_reports, runner_env, start_runner

STEPS = 24  # 8 steps per epoch (64 sequences, 4 per rank, 2 ranks): three epochs
OVERRIDES = {"steps": str(STEPS), "save_steps": "5", "nproc": "2", "step_seconds": "0.25"}
ADAPTER = "adapter_model.safetensors"

pytestmark = pytest.mark.timeout(900)


def tiny_spec(path: Path, store: Path, reports: Path, attempt: int) -> Path:
    """The spec the bot sends for ``/finetune start tiny nproc=2 …``."""
    job = Job(id="ft-ranks", recipe=TINY.name, params=TINY.resolve(OVERRIDES), requested_by="console:test")
    spec = build_spec(job, attempt, TINY, f"file://{store}/", [f"file://{reports}"], "aws", sys.executable)
    path.write_text(spec.model_dump_json())
    return path


@dataclass(frozen=True)
class Reference:
    adapter: bytes
    left_in_tmp: list[str]  # what the launch left in its TMPDIR


def run_two_ranks_alone(root: Path) -> None:
    """An uninterrupted two-rank run of the same command, without the runner, in a TMPDIR of its own: its final
    adapter in ``root/output``, and what it left in the TMPDIR in ``root/left-in-tmp.json``."""
    job = Job(id="ft-ranks", recipe=TINY.name, params=TINY.resolve(OVERRIDES), requested_by="console:test")
    command = build_spec(job, 1, TINY, "file:///unused/", [], "none", sys.executable).command
    command[command.index("--step-seconds") + 1] = "0"  # same arithmetic, no waiting
    command = [sys.executable if item == "${FINETUNE_PYTHON}" else item for item in command]  # as the runner does
    with tempfile.TemporaryDirectory(prefix="ranks-") as scratch:  # short: Unix socket paths stay in 108 bytes
        env = dict(os.environ, FINETUNE_OUTPUT_DIR=str(root / "output"), FINETUNE_RESUME_FROM="", HF_HUB_OFFLINE="1")
        env.update(TMPDIR=scratch)
        env.pop("FINETUNE_STOP_FILE", None)
        run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        (root / "left-in-tmp.json").write_text(json.dumps(sorted(os.listdir(scratch))))


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Reference:
    """The two-rank run without the runner, made once for the whole run (the workers share it)."""
    root = made_once(tmp_path_factory, "ranks-reference", run_two_ranks_alone)
    return Reference((root / "output" / ADAPTER).read_bytes(), json.loads((root / "left-in-tmp.json").read_text()))


async def until(condition: Any, timeout: float = 120.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


async def freeze_ranks(runner: asyncio.subprocess.Process, progress: Path, step: int) -> list[int]:
    """SIGSTOP both ranks once rank 0 reported ``step``, so the step they stop at does not depend on timing."""
    await until(lambda: bool(progress_steps(progress)) and progress_steps(progress)[-1] >= step, timeout=300)
    [launcher] = child_pids(runner.pid)  # `python -m runner.hf.tiny --processes 2`, now torchrun
    ranks = child_pids(launcher)
    assert len(ranks) == 2
    for rank in ranks:
        os.kill(rank, signal.SIGSTOP)
    return ranks


@pytest.fixture
async def imds() -> AsyncIterator[LocalMetadataServer]:
    server = await LocalMetadataServer(instance_id="i-0ranks").start()
    yield server
    await server.stop()


async def test_two_ranks_save_the_same_step_on_notice_and_resume_bitwise_equal(
    tmp_path: Path, imds: LocalMetadataServer, reference: Reference
) -> None:
    store, reports, work = tmp_path / "store", tmp_path / "reports.jsonl", tmp_path / "a1"
    env = runner_env(AWS_EC2_METADATA_SERVICE_ENDPOINT=imds.endpoint, FINETUNE_SYNC_SECONDS="600")
    first = await start_runner(tiny_spec(tmp_path / "a1.json", store, reports, 1), work, env)
    ranks = await freeze_ranks(first, work / "progress.jsonl", 6)
    frozen_at = progress_steps(work / "progress.jsonl")[-1]
    imds.interrupt(seconds=120)
    await until(lambda: (work / "stop-request").exists())
    for rank in ranks:
        os.kill(rank, signal.SIGCONT)
    assert await asyncio.wait_for(first.wait(), 180) == 75  # no rank waits in a collective the other never joins

    [interrupted] = of_type(read_reports(reports), "interrupted")
    reached = progress_steps(work / "progress.jsonl")[-1]
    assert interrupted["saved_in_time"] is True
    # A step's progress line is written after its stop check (on_log follows on_step_end): it may land a step later.
    assert interrupted["step"] == reached and frozen_at <= reached <= frozen_at + 2 < STEPS
    manifest = json.loads((store / f"checkpoint-{reached}" / "MANIFEST.json").read_text())
    files = {item["path"] for item in manifest["files"]}
    assert {"rng_state_0.pth", "rng_state_1.pth", ADAPTER, "optimizer.pt"} <= files  # both ranks' part of it
    state = json.loads((store / f"checkpoint-{reached}" / "trainer_state.json").read_text())
    assert state["global_step"] == reached
    # Neither rank went on past the agreed step.
    assert max(int(p.name.split("-")[1]) for p in (work / "output").glob("checkpoint-*")) == reached
    assert (work / "stop-request.watched").exists()  # the ranks watched the file: torchrun got no signal
    assert "death signal" not in (work / "trainer.log").read_text(errors="replace")

    imds.interruption = None
    second = await start_runner(tiny_spec(tmp_path / "a2.json", store, reports, 2), tmp_path / "a2", env)
    assert await asyncio.wait_for(second.wait(), 300) == 0
    attempt2 = [r for r in read_reports(reports) if r["attempt"] == 2]
    assert of_type(attempt2, "started")[0]["resumed_from_step"] == reached
    assert of_type(attempt2, "completed")[0]["step"] == STEPS
    assert (store / "output" / ADAPTER).read_bytes() == reference.adapter


@pytest.mark.scenario  # its fixture runs the trainer
def test_the_launcher_leaves_no_torchelastic_folder_behind(reference: Reference) -> None:
    """torchrun's log folder (its ranks' error files) goes with the launch, not one more ``torchelastic_*`` in /tmp
    per run."""
    assert [name for name in reference.left_in_tmp if name.startswith("torchelastic_")] == []

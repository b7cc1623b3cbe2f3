"""ms-swift for real: the bot's own ``deepseek-7b`` recipe on a tiny Qwen2 built in code, through the real runner.

The spec is what the bot sends (``build_spec`` of the built-in recipe with ``model=`` / ``dataset=`` /
``dtype=`` overrides); the trainer is ``python -m swift.cli.sft`` from the pinned ms-swift, which loads the
runner's plugin from ``${FINETUNE_SWIFT_PLUGIN}``. Two epochs of 40 rows with the recipe's default
``lora_dropout`` 0.05, interrupted inside the first: the resume crosses the epoch boundary, where swift's
persistent DataLoader workers used to put the dropout masks out of step.

A swift step on this model takes ~20 ms, too fast to aim a notice at from outside; so the trainer is frozen
(SIGSTOP) once it reached a step, the notice is posted, and it is let go (SIGCONT) once the runner has written
its stop request: the step it stops at is then certain, and no timing is raced. The second test launches the
same recipe through the ``swift sft`` wrapper with ``NPROC_PER_NODE=2`` (wrapper → torchrun → two ranks). Cost:
four swift runs of ~10-20 s each, mostly importing swift, torch and transformers (~50 s for the module).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from bot.cloud.local.metadata import LocalMetadataServer
from handlers.jobs import Job
from handlers.recipes import DEEPSEEK_7B, Recipe
from handlers.spec_build import build_spec
from tests.runner_harness import (
    child_pids,
    of_type,
    progress_steps,
    read_reports,
    runner_env,
    start_runner,
)

ROWS_SAMPLED = 40  # dataset=<jsonl>#40: swift's own sampling syntax, kept
STEPS = 2 * ROWS_SAMPLED  # 2 epochs, batch 1, no accumulation
ADAPTER = "adapter_model.safetensors"
RUN_TIMEOUT = 300.0

pytestmark = pytest.mark.timeout(1200)


@pytest.fixture(scope="module")
def tiny_qwen(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("tiny-qwen")
    built = subprocess.run(
        [sys.executable, "-m", "tests.trainers.tiny_qwen", str(root)],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    paths: dict[str, str] = json.loads(built.stdout.splitlines()[-1])
    return paths


def allowing(recipe: Recipe, root: str) -> Recipe:
    """The recipe as a team configures it for a data root of its own (here: where the tiny model was built)."""
    parameters = {
        name: spec.model_copy(update={"allow": [*spec.allow, root]}) if spec.allow else spec
        for name, spec in recipe.parameters.items()
    }
    return Recipe.model_validate({**recipe.model_dump(), "parameters": parameters})


def swift_spec(
    path: Path, tiny_qwen: dict[str, str], store: Path, reports: Path, attempt: int, job: str, notice: str = "aws"
) -> Path:
    """The spec the bot would send for ``/finetune start deepseek-7b model=… dataset=… dtype=float32 …``."""
    overrides = {
        "model": tiny_qwen["model"],
        "dataset": f"{tiny_qwen['data']}#{ROWS_SAMPLED}",
        "dtype": "float32",
        "epochs": "2",
        "grad_accum": "1",
        "save_steps": "10",
        "max_length": "128",
    }
    recipe = allowing(DEEPSEEK_7B, os.path.commonpath([tiny_qwen["model"], tiny_qwen["data"]]) + "/")
    params = recipe.resolve(overrides)
    record = Job(id=job, recipe=recipe.name, params=params, requested_by="console:test")
    spec = build_spec(
        record,
        attempt,
        recipe,
        f"file://{store}/",
        [f"file://{reports}"],
        "aws" if notice == "aws" else "none",
        sys.executable,
    )
    # CPU arithmetic in a fixed order (one thread), so two runs can be compared bit for bit.
    env = {**spec.env, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    path.write_text(spec.model_copy(update={"env": env}).model_dump_json())
    return path


@pytest.fixture
async def imds() -> AsyncIterator[LocalMetadataServer]:
    server = await LocalMetadataServer(instance_id="i-0swift").start()
    yield server
    await server.stop()


@pytest.fixture(scope="module")
def reference(tiny_qwen: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An uninterrupted run of the same spec through the runner: its completed output."""
    base = tmp_path_factory.mktemp("swift-reference")
    store, reports = base / "store", base / "reports.jsonl"
    spec = swift_spec(base / "spec.json", tiny_qwen, store, reports, 1, "ft-swref", notice="none")
    code = subprocess.run(
        [sys.executable, "-m", "runner.cli", "run", "--spec", str(spec), "--work-dir", str(base / "work")],
        env=runner_env(),
        capture_output=True,
        timeout=RUN_TIMEOUT,
    ).returncode
    assert code == 0, (base / "work" / "trainer.log").read_text()[-3000:]
    [completed] = of_type(read_reports(reports), "completed")
    assert completed["step"] == STEPS
    return store / "output"


async def freeze_at_step(runner: asyncio.subprocess.Process, progress: Path, step: int) -> int:
    """SIGSTOP the trainer (the runner's child) as soon as it has reported ``step``; return its pid."""
    deadline = asyncio.get_running_loop().time() + RUN_TIMEOUT
    while asyncio.get_running_loop().time() < deadline:
        steps = progress_steps(progress)
        if steps and steps[-1] >= step:
            [trainer] = child_pids(runner.pid)
            os.kill(trainer, signal.SIGSTOP)
            return trainer
        assert runner.returncode is None, "the runner exited before the trainer reached the step"
        await asyncio.sleep(0.005)
    raise AssertionError(f"trainer never reached step {step}")


async def test_deepseek_recipe_under_swift_saves_on_notice_resumes_and_matches_an_uninterrupted_run(
    tmp_path: Path, tiny_qwen: dict[str, str], imds: LocalMetadataServer, reference: Path
) -> None:
    store, reports = tmp_path / "store", tmp_path / "reports.jsonl"
    env = runner_env(AWS_EC2_METADATA_SERVICE_ENDPOINT=imds.endpoint, FINETUNE_SYNC_SECONDS="600")
    spec = swift_spec(tmp_path / "a1.json", tiny_qwen, store, reports, 1, "ft-swift")
    work = tmp_path / "a1"
    first = await start_runner(spec, work, env)

    trainer = await freeze_at_step(first, work / "progress.jsonl", 8)
    frozen_at = progress_steps(work / "progress.jsonl")[-1]
    assert frozen_at < ROWS_SAMPLED  # still in the first epoch
    imds.interrupt(seconds=120)
    await wait_for(lambda: (work / "stop-request").exists())
    os.kill(trainer, signal.SIGCONT)
    assert await asyncio.wait_for(first.wait(), RUN_TIMEOUT) == 75

    attempt1 = read_reports(reports)
    [interrupted] = of_type(attempt1, "interrupted")
    reached = progress_steps(work / "progress.jsonl")[-1]
    assert interrupted["saved_in_time"] is True
    # A step's progress line is written after its stop check (on_log follows on_step_end): it may land a step later.
    assert interrupted["step"] == reached and frozen_at <= reached <= frozen_at + 2
    assert (store / f"checkpoint-{reached}" / "MANIFEST.json").exists()
    assert (work / "stop-request.watched").exists()  # the plugin's callback watched the file: no signal was sent
    log = (work / "trainer.log").read_text(errors="replace")
    # Seen at a step's end it saves that step; seen while the periodic save of step 10 is written (reached may be
    # 10), it stops after that save: either way the callback said so, and no worker died with the trainer.
    said = ("stop requested: saving checkpoint at step", "stop requested during the save of step")
    assert any(line in log for line in said) and "DataLoader worker" not in log
    assert not of_type(attempt1, "completed")

    imds.interruption = None
    spec2 = swift_spec(tmp_path / "a2.json", tiny_qwen, store, reports, 2, "ft-swift")
    second = await start_runner(spec2, tmp_path / "a2", env)
    code = await asyncio.wait_for(second.wait(), RUN_TIMEOUT)
    assert code == 0, (tmp_path / "a2" / "trainer.log").read_text()[-3000:]
    attempt2 = [r for r in read_reports(reports) if r["attempt"] == 2]
    [started] = of_type(attempt2, "started")
    assert started["resumed_from_step"] == reached
    assert progress_steps(tmp_path / "a2" / "progress.jsonl")[0] == reached + 1
    [completed] = of_type(attempt2, "completed")
    assert completed["step"] == STEPS

    # swift leaves its final adapter in its last checkpoint: the output holds it, without the resume-only state.
    final = store / "output" / f"checkpoint-{STEPS}"
    assert {ADAPTER, "adapter_config.json"} <= {p.name for p in final.iterdir()}
    assert not (final / "optimizer.pt").exists() and not list(final.glob("rng_state*"))
    assert (final / ADAPTER).read_bytes() == (reference / f"checkpoint-{STEPS}" / ADAPTER).read_bytes()


def descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        children = child_pids(todo.pop())
        found += children
        todo += children
    return found


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


async def test_swift_sft_wrapper_with_nproc_per_node_2_stops_both_ranks_at_one_step(
    tmp_path: Path, tiny_qwen: dict[str, str], imds: LocalMetadataServer
) -> None:
    """``swift sft`` + ``NPROC_PER_NODE=2``: the wrapper runs torchrun, which runs two ranks (gloo on CPU)."""
    store, reports, work = tmp_path / "store", tmp_path / "reports.jsonl", tmp_path / "a1"
    spec = json.loads(swift_spec(tmp_path / "spec.json", tiny_qwen, store, reports, 1, "ft-swddp").read_text())
    swift = str(Path(sys.executable).parent / "swift")
    # The wrapper instead of `python -m swift.cli.sft`; on CPU the Trainer does DDP only with a backend named.
    spec["command"] = [swift, "sft", *spec["command"][3:], "--ddp_backend", "gloo"]
    spec["env"]["NPROC_PER_NODE"] = "2"
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    env = runner_env(AWS_EC2_METADATA_SERVICE_ENDPOINT=imds.endpoint, FINETUNE_SYNC_SECONDS="600")
    runner = await start_runner(tmp_path / "spec.json", work, env)

    deadline = asyncio.get_running_loop().time() + RUN_TIMEOUT
    while not (steps := progress_steps(work / "progress.jsonl")) or steps[-1] < 3:
        assert runner.returncode is None and asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.005)
    [torchrun] = [pid for pid in descendants(runner.pid) if "torch.distributed.run" in cmdline(pid)]
    ranks = child_pids(torchrun)  # (their DataLoader workers are their children)
    assert len(ranks) == 2, [cmdline(pid) for pid in ranks]
    for rank in ranks:  # freeze both ranks, so the step they stop at is certain
        os.kill(rank, signal.SIGSTOP)
    frozen_at = progress_steps(work / "progress.jsonl")[-1]
    assert frozen_at < STEPS // 2
    imds.interrupt(seconds=120)
    await wait_for(lambda: (work / "stop-request").exists())
    for rank in ranks:
        os.kill(rank, signal.SIGCONT)
    assert await asyncio.wait_for(runner.wait(), RUN_TIMEOUT) == 75

    [interrupted] = of_type(read_reports(reports), "interrupted")
    reached = progress_steps(work / "progress.jsonl")[-1]
    # A step's progress line is written after its stop check (on_log follows on_step_end), so a rank frozen between
    # the two has done one step more than the file said: the stop lands on the next step boundary or the one after.
    assert interrupted["saved_in_time"] is True and interrupted["step"] == reached <= frozen_at + 2
    manifest = json.loads((store / f"checkpoint-{reached}" / "MANIFEST.json").read_text())
    assert {"rng_state_0.pth", "rng_state_1.pth", ADAPTER} <= {item["path"] for item in manifest["files"]}
    assert max(int(p.name.split("-")[1]) for p in (work / "output").glob("checkpoint-*")) == reached
    log = (work / "trainer.log").read_text(errors="replace")
    assert "death signal" not in log and "DataLoader worker" not in log


async def wait_for(condition: Any, timeout: float = RUN_TIMEOUT) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)

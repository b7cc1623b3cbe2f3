"""Drive the real runner (``finetune-runner run``) as a subprocess, the way user-data or systemd would."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tests.servers import AWS_TEST_ENV

TINY_ARGS = ["--max-steps", "20", "--save-steps", "5"]


def tiny_command(*extra: str) -> list[str]:
    return [sys.executable, "-m", "runner.hf.tiny", *TINY_ARGS, *extra]


def write_spec(path: Path, **fields: Any) -> Path:
    spec: dict[str, Any] = {
        "version": 1,
        "job_id": "ft-test",
        "attempt": 1,
        "command": tiny_command(),
        "env": {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
        "notice": "none",
        "keep_checkpoints": 3,
    }
    spec.update(fields)
    path.write_text(json.dumps(spec))
    return path


def runner_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(AWS_TEST_ENV)
    env.update(
        {
            "FINETUNE_NOTICE_POLL_SECONDS": "0.1",
            "FINETUNE_PROGRESS_SECONDS": "0",
            "FINETUNE_SYNC_SECONDS": "0.2",
            "FINETUNE_CONTROL_POLL_SECONDS": "0.2",
            "FINETUNE_TRAINER_ECHO": "0",
            "FINETUNE_STORAGE_PATIENCE_SECONDS": "30",
            "HF_HUB_OFFLINE": "1",
        }
    )
    env.update(extra)
    return env


async def start_runner(
    spec: Path, work_dir: Path, env: dict[str, str], cwd: Path | None = None, new_session: bool = False
) -> asyncio.subprocess.Process:
    """The runner as user-data starts it; ``new_session``: in a process group of its own, so that a test can
    take the whole instance away at once (:func:`take_instance`)."""
    log = (work_dir.parent / f"{work_dir.name}-runner.log").open("wb")
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "runner.cli",
        "run",
        "--spec",
        str(spec),
        "--work-dir",
        str(work_dir),
        env=env,
        stdout=log,
        stderr=log,
        cwd=cwd,
        start_new_session=new_session,
    )


async def take_instance(runner: asyncio.subprocess.Process, at: datetime) -> None:
    """The cloud reclaims the instance at ``at``: SIGKILL to the runner's process group, nothing runs after. A runner
    that exited before (its report sent, exit 75) left nothing to wait for: its group goes then.

    (The trainer has a session of its own, and dies with the runner through its parent-death signal.)"""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(runner.wait(), max((at - datetime.now(UTC)).total_seconds(), 0.0))
    with contextlib.suppress(ProcessLookupError):
        os.killpg(runner.pid, signal.SIGKILL)
    await runner.wait()


def read_reports(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


async def wait_for_report(
    path: Path, predicate: Callable[[dict[str, Any]], bool], timeout: float = 120.0
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for report in read_reports(path):
            if predicate(report):
                return report
        await asyncio.sleep(0.05)
    raise AssertionError(f"no matching report in {path} after {timeout}s: {read_reports(path)[-5:]}")


async def wait_until(condition: Callable[[], bool], timeout: float = 120.0) -> None:
    """Poll ``condition`` until it holds; a generous ``timeout`` only turns a hang into a failure."""
    async with asyncio.timeout(timeout):
        while True:
            if condition():
                return
            await asyncio.sleep(0.02)


def of_type(reports: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [report for report in reports if report["type"] == kind]


def run_tiny_directly(output_dir: Path, *extra: str) -> Path:
    """An uninterrupted run of the tiny trainer without the runner: the reference result."""
    import subprocess

    env = dict(os.environ, FINETUNE_OUTPUT_DIR=str(output_dir), HF_HUB_OFFLINE="1", FINETUNE_RESUME_FROM="")
    subprocess.run(tiny_command(*extra), env=env, check=True, capture_output=True, timeout=300)
    return output_dir / "adapter_model.safetensors"


def same_tensors(first: bytes, second: bytes) -> bool:
    """Bitwise equality of every tensor in two safetensors files."""
    from safetensors.torch import load

    left, right = load(first), load(second)
    import torch

    return left.keys() == right.keys() and all(torch.equal(left[name], right[name]) for name in left)


def child_pids(pid: int) -> list[int]:
    """The live children of ``pid``, from ``/proc`` (Linux)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_bytes()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 1 and int(fields[1]) == pid:
            found.append(int(entry.name))
    return found


def progress_steps(path: Path) -> list[int]:
    """The steps of a progress file the trainer is still writing (a torn last line is skipped)."""
    if not path.exists():
        return []
    return [json.loads(line)["step"] for line in path.read_text().splitlines() if line.endswith("}")]


def made_once(tmp_path_factory: pytest.TempPathFactory, name: str, make: Callable[[Path], object]) -> Path:
    """The folder ``name`` that ``make`` fills, made once for the whole run: under xdist the first worker to need it
    makes it in the run's shared temporary directory while the others wait on a file lock. For what the tests only
    read (a reference run is trainer processes: seconds of CPU each, much more wall time under load)."""
    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent  # the run's directory, above every worker's own
    output = shared / name
    with (shared / f"{name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not output.is_dir():
            making = shared / f"{name}.{os.getpid()}"
            making.mkdir()
            make(making)
            making.rename(output)  # whole or absent: a worker that dies mid-run leaves no half reference
    return output

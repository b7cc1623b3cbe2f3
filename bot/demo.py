"""``finetune-bot demo``: a spot interruption and recovery, played end to end on this machine.

A real runner runs the real ``tiny`` fine-tune as a "local instance" with its own IMDSv2 endpoint. Mid-training
the demo posts a spot interruption notice there, exactly as EC2 would; the runner checkpoints, commits and
exits; a replacement instance (a fresh runner on an empty work dir) restores the newest valid checkpoint and
finishes. The demo exits 0 only if the job was interrupted, resumed with no step lost, and completed.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from bot.cloud.local_metadata import LocalMetadataServer

TOTAL_STEPS = 30
INTERRUPT_AT_STEP = 12


def state_dir() -> Path:
    return Path(os.environ.get("FINETUNE_STATE_DIR") or ".finetune-state").resolve()


class ReportFeed:
    """Reads the runner's report log as it grows and prints what a team channel would see."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.seen: list[dict[str, Any]] = []

    def poll(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        lines = self.path.read_text().splitlines()
        fresh = [json.loads(line) for line in lines[len(self.seen) :] if line.strip()]
        self.seen.extend(fresh)
        for report in fresh:
            say(describe(report))
        return fresh

    def of_type(self, kind: str, attempt: int | None = None) -> list[dict[str, Any]]:
        return [r for r in self.seen if r["type"] == kind and (attempt is None or r["attempt"] == attempt)]


def describe(report: dict[str, Any]) -> str:
    kind, attempt = report["type"], report["attempt"]
    prefix = f"[attempt {attempt}]"
    if kind == "started":
        where = f"resumed from step {report['resumed_from_step']}" if report["resumed_from_step"] else "fresh start"
        return f"{prefix} runner started on {report.get('instance_id')}: {where}"
    if kind == "progress":
        loss = report.get("loss")
        return f"{prefix} step {report['step']}/{report.get('total_steps')}" + (f"  loss {loss:.4f}" if loss else "")
    if kind == "checkpoint_saved":
        return f"{prefix} checkpoint step {report['step']} committed in {report['seconds']:.2f}s ({report['reason']})"
    if kind == "notice":
        return f"{prefix} ⚠ {report['kind']} notice from {report['source']}, deadline {report.get('deadline')}"
    if kind == "interrupted":
        phases = ", ".join(f"{name} {value:.2f}s" for name, value in report["seconds"].items())
        return f"{prefix} interrupted: checkpoint step {report['step']} committed before the deadline ({phases})"
    if kind == "completed":
        return f"{prefix} ✅ completed at step {report['step']}, output {report['output_uri']}"
    if kind == "failed":
        return f"{prefix} ❌ failed: {report['reason']}"
    return f"{prefix} {kind}: {report.get('message', '')}"


def say(text: str) -> None:
    print(text, flush=True)


async def launch(spec: dict[str, Any], root: Path, imds: LocalMetadataServer) -> asyncio.subprocess.Process:
    """Boot a 'local instance': the runner, pointed at this instance's metadata service."""
    attempt = spec["attempt"]
    spec_path = root / f"spec-attempt-{attempt}.json"
    spec_path.write_text(json.dumps(spec))
    env = dict(
        os.environ,
        AWS_EC2_METADATA_SERVICE_ENDPOINT=imds.endpoint,
        FINETUNE_PROGRESS_SECONDS="0",
        FINETUNE_NOTICE_POLL_SECONDS="0.2",
        FINETUNE_TRAINER_ECHO="0",
        FINETUNE_LOG_LEVEL="WARNING",
        HF_HUB_OFFLINE="1",
    )
    log = (root / f"runner-attempt-{attempt}.log").open("wb")
    work = root / f"instance-{attempt}"
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "runner.cli",
        "run",
        "--spec",
        str(spec_path),
        "--work-dir",
        str(work),
        env=env,
        stdout=log,
        stderr=log,
    )


async def follow(feed: ReportFeed, process: asyncio.subprocess.Process, until_step: int | None = None) -> None:
    """Print reports until the runner exits (or, with ``until_step``, until training reaches it)."""
    while process.returncode is None:
        feed.poll()
        progress = feed.of_type("progress")
        if until_step is not None and progress and progress[-1]["step"] >= until_step:
            return
        await asyncio.sleep(0.1)
    feed.poll()


async def run_demo() -> int:
    job_id = "ft-" + uuid.uuid4().hex[:4]
    root = state_dir() / "demo" / job_id
    root.mkdir(parents=True)
    feed = ReportFeed(root / "reports.jsonl")
    spec: dict[str, Any] = {
        "version": 1,
        "job_id": job_id,
        "attempt": 1,
        "command": [
            sys.executable,
            "-m",
            "runner.hf.tiny",
            "--max-steps",
            str(TOTAL_STEPS),
            "--save-steps",
            "5",
            "--step-seconds",
            "0.2",
        ],
        "env": {"HF_HUB_OFFLINE": "1"},
        "checkpoint_uri": f"file://{root}/bucket/",
        "report": [f"file://{feed.path}"],
        "notice": "aws",
    }
    say(f"/finetune start tiny  →  job {job_id} (state in {root})")

    first_instance = await LocalMetadataServer(instance_id="i-0demo00000000001").start()
    second_instance = await LocalMetadataServer(instance_id="i-0demo00000000002").start()
    try:
        first = await launch(spec, root, first_instance)
        await follow(feed, first, until_step=INTERRUPT_AT_STEP)
        say(f"/finetune interrupt-test {job_id}  →  EC2 posts a spot interruption notice (2 minutes)")
        first_instance.interrupt(seconds=120)
        first_code = await first.wait()
        await follow(feed, first)
        interrupted_at = time.monotonic()

        say("relaunching on a replacement instance (attempt 2)")
        second = await launch({**spec, "attempt": 2}, root, second_instance)
        await follow(feed, second)
        downtime = _downtime(feed)
    finally:
        await first_instance.stop()
        await second_instance.stop()
    return summarize(feed, first_code, second.returncode, downtime or time.monotonic() - interrupted_at)


def _downtime(feed: ReportFeed) -> float | None:
    """Seconds from the interruption report to the replacement's start report (both stamped by runners)."""
    from datetime import datetime

    interrupted, started = feed.of_type("interrupted", 1), feed.of_type("started", 2)
    if not interrupted or not started:
        return None
    return (datetime.fromisoformat(started[0]["time"]) - datetime.fromisoformat(interrupted[0]["time"])).total_seconds()


def summarize(feed: ReportFeed, first_code: int | None, second_code: int | None, downtime: float) -> int:
    interrupted = feed.of_type("interrupted", 1)
    started = feed.of_type("started", 2)
    completed = feed.of_type("completed", 2)
    reached = max((r["step"] for r in feed.of_type("progress", 1)), default=0)
    resumed = started[0]["resumed_from_step"] if started else None
    lost = reached - resumed if resumed is not None else reached
    checks = {
        "interrupted by the spot notice (exit 75)": first_code == 75 and bool(interrupted),
        "checkpoint committed before the deadline": bool(interrupted) and interrupted[0]["saved_in_time"],
        f"resumed at step {resumed}, {lost} steps lost": resumed is not None and lost == 0,
        "finished": second_code == 0 and bool(completed) and completed[0]["step"] == TOTAL_STEPS,
    }
    say("")
    say(f"summary: 2 attempts, 1 interruption, downtime {downtime:.1f}s, {lost} steps lost")
    for what, ok in checks.items():
        say(f"  {'✔' if ok else '✘'} {what}")
    return 0 if all(checks.values()) else 1


def main() -> int:
    return asyncio.run(run_demo())

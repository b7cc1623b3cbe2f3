"""A spot notice that meets a periodic save: how many steps the trainer trained past the checkpoint committed
(the promise: 0), and notice → commit.

A real runner subprocess, a local IMDSv2 posting the notice once the periodic checkpoint's directory is on the disk
and not yet complete, moto in server mode as S3. Two trainers: the synthetic one that only handles SIGTERM (it
saves the step after the save in flight when asked) and the tiny HF Trainer with the callback (it stops right
after the save in flight). Two windows: a roomy one (a fresh save fits) and a tight one (it does not: the runner
holds the trainer once the save in flight is complete).

    python bench/notice_during_save.py [--runs 2] [--mib 256] [--write-mib-per-second 100]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import boto3  # noqa: E402

from bench.moto_server import AWS_TEST_ENV, moto_server  # noqa: E402
from bot.cloud.local.metadata import LocalMetadataServer  # noqa: E402


def reports(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def progress_steps(path: Path) -> list[int]:
    if not path.exists():
        return []
    return [json.loads(line)["step"] for line in path.read_text().splitlines() if line.endswith("}")]


async def until(condition: Callable[[], bool]) -> None:
    while True:
        if condition():
            return
        await asyncio.sleep(0.01)


async def one_run(endpoint: str, work: Path, name: str, command: list[str], window: float) -> dict[str, Any]:
    imds = await LocalMetadataServer().start()
    log = work / f"{name}.jsonl"
    spec = {
        "version": 1,
        "job_id": "ft-bench",
        "attempt": 1,
        "command": command,
        "env": {"HF_HUB_OFFLINE": "1"},
        "checkpoint_uri": f"s3://bench/{name}/",
        "report": [f"file://{log}"],
        "notice": "aws",
    }
    spec_path = work / f"{name}.json"
    spec_path.write_text(json.dumps(spec))
    env = dict(
        os.environ,
        **AWS_TEST_ENV,
        AWS_ENDPOINT_URL=endpoint,
        AWS_EC2_METADATA_SERVICE_ENDPOINT=imds.endpoint,
        FINETUNE_PROGRESS_SECONDS="0",
        FINETUNE_TRAINER_ECHO="0",
        FINETUNE_LOG_LEVEL="WARNING",
        FINETUNE_NOTICE_POLL_SECONDS="0.1",
        FINETUNE_REPORT_RESERVE_SECONDS="2",
        # The trainer is this interpreter, which another user may not reach on a development host (docs/runner.md).
        FINETUNE_TRAINER_USER=os.environ.get("FINETUNE_TRAINER_USER", "root"),
    )
    run_dir = work / name
    runner = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "runner.cli", "run", "--spec", str(spec_path), "--work-dir", str(run_dir)),
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        saving = run_dir / "output" / "checkpoint-3"
        await until(saving.is_dir)
        noticed = time.monotonic()
        imds.interrupt(seconds=window)
        await until(lambda: any(r["type"] == "interrupted" for r in reports(log)))
        reported = time.monotonic() - noticed
        await runner.wait()
    finally:
        if runner.returncode is None:
            runner.kill()
            await runner.wait()
        await imds.stop()
    [interrupted] = [r for r in reports(log) if r["type"] == "interrupted"]
    trained = progress_steps(run_dir / "progress.jsonl")
    committed = interrupted["step"] or 0
    return {
        "committed": committed,
        "trained": trained[-1] if trained else None,
        "past_commit": (trained[-1] if trained else 0) - committed,
        "fresh": interrupted["fresh_save"],
        "report_s": reported,
        "commit_s": interrupted["seconds"].get("total"),
    }


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--write-mib-per-second", type=int, default=100)
    args = parser.parse_args()
    sigterm = [
        sys.executable,
        "-m",
        "tests.trainers.synthetic",
        *("--checkpoint-mib", str(args.mib), "--write-mib-per-second", str(args.write_mib_per_second)),
        *("--save-at", "3", "--step-seconds", "1"),
    ]
    save_seconds = args.mib / args.write_mib_per_second
    callback = [
        sys.executable,
        "-m",
        "runner.hf.tiny",
        *("--max-steps", "30", "--save-steps", "3", "--save-seconds", f"{save_seconds:.1f}", "--step-seconds", "0.5"),
    ]
    with tempfile.TemporaryDirectory() as tmp, moto_server(Path(tmp)) as endpoint:
        s3 = boto3.client("s3", endpoint_url=endpoint, **_credentials())
        s3.create_bucket(Bucket="bench")
        print(
            f"{'trainer':<22} {'window':>7} {'run':>3} {'committed':>9} {'trained':>7} {'past':>4} "
            f"{'fresh save':>10} {'notice→report s':>15}"
        )
        for name, command in (("sigterm-only", sigterm), ("hf-callback", callback)):
            for window in (120.0, 2.0 * save_seconds + 4.0):
                for run in range(args.runs):
                    tag = f"{name}-{int(window)}-{run}"
                    got = await one_run(endpoint, Path(tmp), tag, command, window)
                    print(
                        f"{name:<22} {window:>6.0f}s {run:>3} {got['committed']:>9} {got['trained']!s:>7} "
                        f"{got['past_commit']:>4} {got['fresh']:>10} {got['report_s']:>15.2f}",
                        flush=True,
                    )


def _credentials() -> dict[str, str]:
    return {
        "aws_access_key_id": AWS_TEST_ENV["AWS_ACCESS_KEY_ID"],
        "aws_secret_access_key": AWS_TEST_ENV["AWS_SECRET_ACCESS_KEY"],
        "region_name": AWS_TEST_ENV["AWS_DEFAULT_REGION"],
    }


if __name__ == "__main__":
    asyncio.run(main())

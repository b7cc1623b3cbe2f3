"""Notice → checkpoint committed, end to end: a real runner subprocess, a local IMDSv2 posting the spot notice,
moto in server mode as S3. Measured from posting the notice to the runner's ``interrupted`` report (so it
includes detection, the trainer's save, the parallel upload and the manifest commit).

Trainers: the tiny HF Trainer in one process; the same with two torchrun ranks (``nproc=2``: the stop file, the
ranks' all-reduce on it, both ranks saving); ms-swift running the bot's ``deepseek-7b`` recipe on a tiny Qwen2
built in code (``python -m swift.cli.sft`` with the runner's plugin); a synthetic trainer with a big checkpoint.

    python bench/notice_to_commit.py [--tiny-runs 3] [--ranks-runs 2] [--swift-runs 2] [--big-runs 2]
        [--big-mib 64,256,1024] [--slow-save-mib-per-second 100]

The synthetic checkpoint (one big file) is written by ``tests/trainers/synthetic.py``: once at disk speed, and
once at ``--slow-save-mib-per-second`` (weights copied off a GPU piece by piece). Its parts go up as the file
grows, so notice → committed should approach max(save, upload) rather than their sum. Both are measured in the
same run: save is the runner's own figure (notice → checkpoint complete on disk), upload is the runner's S3
store uploading the finished file once more, alone, right after the run (to a key of its own).
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
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import boto3  # noqa: E402

from bench.moto_server import AWS_TEST_ENV, moto_server  # noqa: E402
from bot.cloud.local.metadata import LocalMetadataServer  # noqa: E402
from handlers.jobs import Job  # noqa: E402
from handlers.recipes import DEEPSEEK_7B, TINY, Recipe  # noqa: E402
from handlers.spec_build import build_spec  # noqa: E402
from runner.storage.s3 import S3Store  # noqa: E402


def reports(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


async def wait_for(path: Path, kind: str, min_step: int = 0) -> dict[str, Any]:
    while True:
        for report in reports(path):
            if report["type"] == kind and report.get("step", 0) >= min_step:
                return report
        await asyncio.sleep(0.01)


async def one_run(endpoint: str, work: Path, name: str, command: list[str], interrupt_at: int) -> dict[str, Any]:
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
        FINETUNE_SYNC_SECONDS="3600",
        # The trainer is this interpreter, which another user may not reach on a development host (docs/runner.md).
        FINETUNE_TRAINER_USER=os.environ.get("FINETUNE_TRAINER_USER", "root"),
    )  # no periodic sync: the notice path does all the work
    runner = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "runner.cli",
        "run",
        "--spec",
        str(spec_path),
        "--work-dir",
        str(work / name),
        env=env,
        cwd=ROOT,
    )
    try:
        await wait_for(log, "progress", interrupt_at)
        posted = time.perf_counter()
        imds.interrupt(seconds=120)
        interrupted = await wait_for(log, "interrupted")
        wall = time.perf_counter() - posted
        code = await runner.wait()
    finally:
        await imds.stop()
    saved = [r for r in reports(log) if r["type"] == "checkpoint_saved"][-1]
    return {
        "wall": wall,
        "code": code,
        "bytes": saved["bytes"],
        **interrupted["seconds"],
        "in_time": interrupted["saved_in_time"],
        "alone": await upload_alone(work / name, name),
    }


async def upload_alone(work_dir: Path, name: str) -> float | None:
    """Seconds for the runner's store to upload the run's biggest checkpoint file alone (synthetic runs only)."""
    found = sorted(work_dir.rglob("checkpoint-*/model.bin"), key=lambda path: path.stat().st_mtime)
    if not found:
        return None
    store = S3Store(f"s3://bench/{name}-alone/")  # at AWS_ENDPOINT_URL, moto
    try:
        await store.put_bytes("warm-up", b"x")  # a connection and a client, as the runner has by the notice
        started = time.perf_counter()
        await store.upload_file(found[-1], "model.bin")
        return time.perf_counter() - started
    finally:
        await store.close()


def recipe_command(recipe: Recipe, overrides: dict[str, str]) -> list[str]:
    """The trainer argv the bot renders for ``/finetune start <recipe> key=value …``."""
    job = Job(id="ft-bench", recipe=recipe.name, params=recipe.resolve(overrides), requested_by="console:bench")
    return build_spec(job, 1, recipe, "file:///unused/", [], "aws", sys.executable).command


def tiny_qwen(work: Path) -> dict[str, str]:
    built = subprocess.run(
        [sys.executable, "-m", "tests.trainers.tiny_qwen", str(work / "qwen")],
        check=True,
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    paths: dict[str, str] = json.loads(built.stdout.splitlines()[-1])
    return paths


def show(label: str, runs: list[dict[str, Any]]) -> None:
    print(label)
    for run in runs:
        mib = run["bytes"] / 2**20
        rate = mib / run["total"] if run["total"] else float("inf")
        print(
            f"  notice→committed {run['wall']:6.2f}s  (trainer save {run['save']:5.2f}s, then upload tail + commit "
            f"{run['upload']:5.2f}s; {mib:7.1f} MiB at {rate:6.1f} MiB/s from the notice; exit {run['code']}, "
            f"saved in time {run['in_time']})"
        )
        if run["alone"] is not None:
            bound = max(run["save"], run["alone"])
            print(
                f"    the file uploaded alone {run['alone']:5.2f}s: max(save, upload) {bound:5.2f}s, notice→committed "
                f"{run['wall'] / bound:4.2f}× that (aim ≤ 1.1×)"
            )


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tiny-runs", type=int, default=3)
    parser.add_argument("--ranks-runs", type=int, default=2)
    parser.add_argument("--swift-runs", type=int, default=2)
    parser.add_argument("--big-runs", type=int, default=2)
    parser.add_argument("--big-mib", default="64,256,1024", help="synthetic checkpoint sizes, comma-separated")
    parser.add_argument("--slow-save-mib-per-second", type=float, default=100.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, moto_server(Path(tmp)) as endpoint:
        work = Path(tmp)
        os.environ.update(AWS_TEST_ENV, AWS_ENDPOINT_URL=endpoint)
        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="bench")
        tiny = [sys.executable, "-m", "runner.hf.tiny", "--max-steps", "200", "--step-seconds", "0.1"]
        if args.tiny_runs:
            show(
                "tiny model (LoRA on a tiny Llama, HF Trainer):",
                [await one_run(endpoint, work, f"tiny-{i}", tiny, 8) for i in range(args.tiny_runs)],
            )
        ranks = recipe_command(TINY, {"steps": "200", "step_seconds": "0.1", "nproc": "2"})
        if args.ranks_runs:
            show(
                "tiny model, two torchrun ranks (gloo):",
                [await one_run(endpoint, work, f"ranks-{i}", ranks, 8) for i in range(args.ranks_runs)],
            )
        if args.swift_runs:
            qwen = tiny_qwen(work)
            swift = recipe_command(
                DEEPSEEK_7B,
                {
                    "model": qwen["model"],
                    "dataset": qwen["data"],
                    "dtype": "float32",
                    "epochs": "20",
                    "grad_accum": "1",
                    "max_length": "128",
                },
            )
            show(
                "ms-swift, deepseek-7b recipe on a tiny Qwen2 (LoRA, 4 DataLoader workers):",
                [await one_run(endpoint, work, f"swift-{i}", swift, 20) for i in range(args.swift_runs)],
            )
        for mib in (int(size) for size in args.big_mib.split(",") if size):
            big = [
                *(sys.executable, "-m", "tests.trainers.synthetic", "--checkpoint-mib", str(mib)),
                *("--save-every", "1000000000", "--step-seconds", "0.1"),
            ]
            slow = [*big, "--write-mib-per-second", str(args.slow_save_mib_per_second)]
            show(
                f"synthetic {mib} MiB checkpoint, saved at disk speed:",
                [await one_run(endpoint, work, f"big-{mib}-{i}", big, 3) for i in range(args.big_runs)],
            )
            show(
                f"synthetic {mib} MiB checkpoint, saved at {args.slow_save_mib_per_second:.0f} MiB/s:",
                [await one_run(endpoint, work, f"slow-{mib}-{i}", slow, 3) for i in range(args.big_runs)],
            )


if __name__ == "__main__":
    asyncio.run(main())

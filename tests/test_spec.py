"""The job spec refuses anything it should not run, naming the field; the runner then starts nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from handlers.spec import parse_spec


def spec(**changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "version": 1,
        "job_id": "ft-7k2q",
        "attempt": 2,
        "command": ["python", "-m", "runner.hf.tiny"],
        "env": {"HF_HUB_OFFLINE": "1"},
        "checkpoint_uri": "s3://bucket-1/jobs/ft-7k2q",
        "report": ["file:///tmp/reports.jsonl", "sns:arn:aws:sns:us-east-1:123456789012:finetune", "https://bot/r"],
        "notice": "aws",
        "keep_checkpoints": 3,
    }
    base.update(changes)
    return {key: value for key, value in base.items() if value is not None}


def test_a_valid_spec_parses_and_normalises_the_checkpoint_uri() -> None:
    parsed = parse_spec(json.dumps(spec()))
    assert parsed.checkpoint_uri == "s3://bucket-1/jobs/ft-7k2q/"
    assert parsed.command == ["python", "-m", "runner.hf.tiny"]
    assert parsed.max_restarts == 2
    assert parsed.release is None


@pytest.mark.parametrize(
    ("changes", "field", "words"),
    [
        ({"command": "python train.py --lr 1e-4"}, "command", "shell string"),
        ({"command": ["python train.py --lr 1e-4"]}, "command", "shell string"),
        ({"command": []}, "command", "at least 1"),
        ({"surprise": True}, "surprise", "Extra inputs"),
        ({"checkpoint_uri": "ftp://host/x"}, "checkpoint_uri", "s3://"),
        ({"checkpoint_uri": "s3://B_ad/x"}, "checkpoint_uri", "bucket"),
        ({"checkpoint_uri": "file://relative/path"}, "checkpoint_uri", "absolute"),
        ({"checkpoint_uri": "s3://bucket-1/a/../b"}, "checkpoint_uri", ".."),
        ({"report": ["sns:not-an-arn"]}, "report", "sns:<topic ARN>"),
        ({"report": ["gopher://x"]}, "report", "must be"),
        ({"env": {"FINETUNE_OUTPUT_DIR": "/etc"}}, "env", "set by the runner"),
        ({"env": {"BAD NAME": "x"}}, "env", "not a valid"),
        ({"version": 2}, "version", "1"),
        ({"job_id": "job 1; rm -rf /"}, "job_id", "pattern"),
        ({"attempt": 0}, "attempt", "greater than or equal"),
        ({"notice": "gcp"}, "notice", "aws"),
        ({"keep_checkpoints": 0}, "keep_checkpoints", "greater than or equal"),
        ({"release": {"type": "aws-autoscaling"}}, "release", "group"),
        ({"release": {"kind": "aws-instance"}}, "release", "discriminator 'type'"),  # no other spelling
    ],
)
def test_bad_specs_name_the_field(changes: dict[str, Any], field: str, words: str) -> None:
    with pytest.raises(ValueError) as caught:
        parse_spec(json.dumps(spec(**changes)))
    message = str(caught.value)
    assert message.startswith("invalid job spec: ")
    assert field in message
    assert words in message


def test_malformed_json_is_a_spec_error() -> None:
    with pytest.raises(ValueError, match=r"^invalid job spec: "):
        parse_spec(b"{not json")


def test_the_cli_refuses_a_bad_spec_and_starts_nothing(tmp_path: Path) -> None:
    marker = tmp_path / "trainer-ran"
    bad = spec(command=f"touch {marker}", report=[f"file://{tmp_path}/reports.jsonl"])
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(bad))
    result = subprocess.run(
        [sys.executable, "-m", "runner.cli", "run", "--spec", str(path), "--work-dir", str(tmp_path / "work")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "command" in result.stderr and "shell string" in result.stderr
    assert not marker.exists()
    assert not (tmp_path / "work").exists()
    assert not (tmp_path / "reports.jsonl").exists()


def test_the_cli_names_a_missing_spec_file(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "runner.cli", "run", "--spec", str(tmp_path / "nope.json")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "nope.json" in result.stderr


def test_runner_paths_are_put_into_argv_without_a_shell() -> None:
    from runner.trainer import expand_argv

    template = [
        "swift",
        "sft",
        "--output_dir",
        "${FINETUNE_OUTPUT_DIR}",
        "--resume_from_checkpoint",
        "${FINETUNE_RESUME_FROM}",
        "--note",
        "$HOME;${OTHER}",
    ]
    fresh = {"FINETUNE_OUTPUT_DIR": "/w/out", "FINETUNE_RESUME_FROM": "", "FINETUNE_PROGRESS_FILE": "/w/p"}
    assert expand_argv(template, fresh) == ["swift", "sft", "--output_dir", "/w/out", "--note", "$HOME;${OTHER}"]
    resumed = {**fresh, "FINETUNE_RESUME_FROM": "/w/out/checkpoint-40"}
    assert expand_argv(template, resumed)[4:6] == ["--resume_from_checkpoint", "/w/out/checkpoint-40"]

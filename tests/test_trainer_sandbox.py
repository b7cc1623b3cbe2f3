"""The trainer runs as nobody in particular: another user than a root runner, with an environment of its own.

The real runner (``python -m runner.cli run``) is started as root with the secrets a runner or a bot on the same
machine holds; its trainer is a shell script any user can run, which writes down who it is and the environment it
was given (``/proc/$$/environ``), and tries to read the runner's. Its work directory is outside pytest's private
temporary directories (mode 0700), where the trainer's user can reach it, as under ``/tmp/finetune-runner``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from runner.manifest import checkpoint_files
from runner.trainer_env import TrainerSetup, build_environment
from runner.trainer_user import DEFAULT_TRAINER_USER, FALLBACK_TRAINER_USER, trainer_user
from tests.runner_harness import of_type, read_reports, runner_env, start_runner, write_spec

SECRETS = {
    "FINETUNE_REPORT_SECRET": "master-report-secret-7f3a",
    "AWS_SECRET_ACCESS_KEY": "aws-secret-9c1e",
    "ALIBABA_CLOUD_ACCESS_KEY_SECRET": "aliyun-secret-44d0",
    "REDIS_URL": "redis://:redis-password-e2b8@127.0.0.1:6379/0",
    "SLACK_BOT_TOKEN": "xoxb-slack-token-5a61",
    "SLACK_SIGNING_SECRET": "slack-signing-0b7c",
    "DINGTALK_CLIENT_SECRET": "dingtalk-secret-12fe",
    "FINETUNE_SLACK_SIGNING_SECRET": "bot-setting-3d9a",
}

TRAINER = r"""
set -eu
out="$FINETUNE_OUTPUT_DIR"
id -u > "$out/uid"
id -G > "$out/groups"
cat /proc/$$/environ > "$out/environ"
seen=denied
if cat /proc/$PPID/environ > /dev/null 2>&1; then seen=read; fi
echo $seen > "$out/runner-environ"
log="$(dirname "$FINETUNE_STOP_FILE")/trainer.log"
touched=denied
if echo x >> "$log" 2>/dev/null || rm -f "$log" 2>/dev/null; then touched=open; fi
echo $touched > "$out/runner-file"
touch "$HOME/cache"
echo '{"step": 1, "total_steps": 1}' >> "$FINETUNE_PROGRESS_FILE"
echo done > "$out/result.txt"
"""


@pytest.fixture(scope="module")
def trainer_account() -> pwd.struct_passwd:
    """The image's trainer user (created here when missing), or ``nobody`` where it cannot be."""
    if os.geteuid() != 0:
        pytest.skip("switching the trainer's user needs a root runner")
    try:
        return pwd.getpwnam(DEFAULT_TRAINER_USER)
    except KeyError:
        pass
    made = subprocess.run(
        [
            "useradd",
            "--system",
            "--user-group",
            "--no-create-home",
            "--shell",
            "/usr/sbin/nologin",
            DEFAULT_TRAINER_USER,
        ],
        capture_output=True,
        check=False,
    )
    return pwd.getpwnam(DEFAULT_TRAINER_USER if made.returncode == 0 else FALLBACK_TRAINER_USER)


@pytest.fixture
def reachable() -> Iterator[Path]:
    """A directory any user can pass through, as the runner's default work directory is."""
    path = Path(tempfile.mkdtemp(prefix="finetune-sandbox-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def environ_of(path: Path) -> dict[str, str]:
    entries = [entry.split(b"=", 1) for entry in path.read_bytes().split(b"\0") if entry]
    return {name.decode(): value.decode() for name, value in entries}


async def test_a_root_runner_starts_its_trainer_as_another_user_with_none_of_its_secrets(
    tmp_path: Path, reachable: Path, trainer_account: pwd.struct_passwd
) -> None:
    store, reports, work = tmp_path / "store", tmp_path / "reports.jsonl", reachable / "work"
    spec = write_spec(
        tmp_path / "spec.json",
        checkpoint_uri=f"file://{store}/",
        report=[f"file://{reports}"],
        command=["/bin/sh", "-c", TRAINER],
        env={"HF_HUB_OFFLINE": "1", "RECIPE_SETTING": "from-the-recipe"},
    )
    env = runner_env(
        FINETUNE_TRAINER_USER=trainer_account.pw_name,
        FINETUNE_TRAINER_ENV="HF_TOKEN",
        HF_TOKEN="hf-token-named-by-the-operator",
        NOT_NAMED="left-behind",
        **SECRETS,
    )
    runner = await start_runner(spec, work, env)
    assert await asyncio.wait_for(runner.wait(), 120) == 0, (reachable / "work-runner.log").read_text()[-3000:]
    [completed] = of_type(read_reports(reports), "completed")
    assert completed["job_id"] == "ft-test"

    output = work / "output"
    assert int((output / "uid").read_text()) == trainer_account.pw_uid != os.geteuid()
    assert "0" not in (output / "groups").read_text().split()  # none of root's groups either
    assert (output / "runner-environ").read_text().strip() == "denied"  # nor a look at the runner's environment
    assert (output / "runner-file").read_text().strip() == "denied"  # nor a write to the runner's own files
    assert (store / "output" / "result.txt").read_text() == "done\n"  # the runner still uploads what it wrote

    seen = environ_of(output / "environ")
    raw = (output / "environ").read_bytes()
    assert not any(value.encode() in raw for value in SECRETS.values())
    assert not [name for name in seen if name.startswith(("AWS_", "ALIBABA_CLOUD_", "SLACK_", "DINGTALK_", "REDIS"))]
    assert "NOT_NAMED" not in seen and "FINETUNE_TRAINER_USER" not in seen
    assert {name for name in seen if name.startswith("FINETUNE_")} == {
        "FINETUNE_OUTPUT_DIR",
        "FINETUNE_RESUME_FROM",
        "FINETUNE_PROGRESS_FILE",
        "FINETUNE_STOP_FILE",
        "FINETUNE_SWIFT_PLUGIN",
        "FINETUNE_PYTHON",
    }
    assert seen["HOME"] == str(work / "home") and seen["USER"] == trainer_account.pw_name
    assert seen["HF_TOKEN"] == "hf-token-named-by-the-operator" and seen["HF_HUB_OFFLINE"] == "1"
    assert seen["RECIPE_SETTING"] == "from-the-recipe" and seen["PATH"] == env["PATH"]
    assert seen["PYTHONPATH"] == str(work / "pythonpath")  # no FINETUNE_TRAINER_PYTHONPATH: only the runner's package

    # What the trainer writes is its own; what the runner writes stays the runner's.
    assert (work / "home" / "cache").stat().st_uid == trainer_account.pw_uid
    assert (output / "uid").stat().st_uid == trainer_account.pw_uid
    assert (work / "progress.jsonl").stat().st_uid == trainer_account.pw_uid
    assert (work / "trainer.log").stat().st_uid == os.geteuid()


async def test_a_trainer_its_user_cannot_reach_fails_before_anything_is_restored(
    tmp_path: Path, reachable: Path, trainer_account: pwd.struct_passwd
) -> None:
    private = tmp_path / "private"  # mode 0700, as pytest makes it: only root passes
    private.mkdir(mode=0o700)
    tmp_path.chmod(0o700)
    program = private / "train.sh"
    program.write_text("#!/bin/sh\nexit 0\n")
    program.chmod(0o755)
    reports = tmp_path / "reports.jsonl"
    spec = write_spec(
        tmp_path / "spec.json",
        checkpoint_uri=f"file://{tmp_path}/store/",
        report=[f"file://{reports}"],
        command=[str(program)],
    )
    runner = await start_runner(spec, reachable / "work", runner_env(FINETUNE_TRAINER_USER=trainer_account.pw_name))
    assert await asyncio.wait_for(runner.wait(), 60) == 1
    [failed] = read_reports(reports)
    assert failed["failure"]["code"] == "trainer-out-of-reach"
    assert failed["failure"]["values"] == {
        "program": str(program),
        "user": trainer_account.pw_name,
        "setting": "FINETUNE_TRAINER_USER",
    }
    assert not (tmp_path / "store").exists()


@pytest.mark.parametrize("name", ["FINETUNE_REPORT_SECRET", "AWS_SECRET_ACCESS_KEY", "REDIS_URL", "not a name"])
async def test_a_runner_told_to_pass_a_secret_to_its_trainer_refuses_to_start(tmp_path: Path, name: str) -> None:
    reports = tmp_path / "reports.jsonl"
    spec = write_spec(tmp_path / "spec.json", checkpoint_uri=f"file://{tmp_path}/store/", report=[f"file://{reports}"])
    runner = await start_runner(spec, tmp_path / "work", runner_env(FINETUNE_TRAINER_ENV=f"HF_TOKEN,{name}"))
    assert await asyncio.wait_for(runner.wait(), 60) == 2
    assert not reports.exists() and not (tmp_path / "work").exists()
    assert "FINETUNE_TRAINER_ENV" in (tmp_path / "work-runner.log").read_text()


def test_the_trainers_user_falls_back_to_nobody_and_stays_the_runner_when_it_cannot_switch(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, logger="runner.trainer_user"):
        fallback = trainer_user("finetune-no-such-user", runner_uid=0)
    assert fallback is not None and fallback.name == FALLBACK_TRAINER_USER
    assert fallback.uid == pwd.getpwnam(FALLBACK_TRAINER_USER).pw_uid
    assert "'finetune-no-such-user' does not exist here: the trainer runs as nobody" in caplog.text
    assert trainer_user("nobody", runner_uid=1000) is None  # not root: it runs the trainer as itself
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="runner.trainer_user"):
        assert trainer_user("root", runner_uid=0) is None
    assert "the trainer runs as root" in caplog.text


def test_the_environment_is_named_variable_by_variable() -> None:
    runner = {
        **SECRETS,
        "PATH": "/opt/finetune/bin:/usr/bin",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "CUDA_VISIBLE_DEVICES": "0,1",
        "NCCL_DEBUG": "WARN",
        "HOME": "/root",
        "PYTHONPATH": "/work/project",
        "HF_HUB_OFFLINE": "1",
        "SOMETHING_ELSE": "x",
        "FINETUNE_TRAINER_PYTHONPATH": "/opt/extra",
    }
    setup = TrainerSetup.from_env(runner, user=None)
    env = build_environment(
        setup, {"NPROC_PER_NODE": "2"}, {"FINETUNE_OUTPUT_DIR": "/w/output"}, Path("/w/home"), Path("/w/py"), runner
    )
    assert env == {
        "PATH": "/opt/finetune/bin:/usr/bin",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "CUDA_VISIBLE_DEVICES": "0,1",
        "NCCL_DEBUG": "WARN",
        "HOME": "/root",  # the runner's own user runs it: its HOME
        "HF_HUB_OFFLINE": "1",
        "PYTHONUNBUFFERED": "1",
        "NPROC_PER_NODE": "2",
        "FINETUNE_OUTPUT_DIR": "/w/output",
        "PYTHONPATH": "/w/py:/opt/extra",  # the runner's package, then only what the runner was told to give
    }


def test_a_link_in_a_checkpoint_is_never_read_by_the_runner(tmp_path: Path) -> None:
    """The trainer writes the checkpoints the root runner uploads: a link there would upload what it points at."""
    secret = tmp_path / "root-only"
    secret.write_text("not the trainer's")
    checkpoint = tmp_path / "output" / "checkpoint-5"
    checkpoint.mkdir(parents=True)
    (checkpoint / "adapter.safetensors").write_bytes(b"w")
    (checkpoint / "leak.bin").symlink_to(secret)
    (tmp_path / "output" / "checkpoint-6").symlink_to(tmp_path, target_is_directory=True)
    assert checkpoint_files(checkpoint) == [checkpoint / "adapter.safetensors"]
    assert checkpoint_files(tmp_path / "output" / "checkpoint-6") == []

"""``make demo`` as a reader runs it first, made once per test run: the quickstarts' first block and the demo story.

Every quickstart (docs/quickstart.md, quickstart-slack.md, quickstart-dingtalk.md) begins with ``make demo``, the
same command in the same kind of checkout, and ``tests/test_bot_scenarios.py`` tells the demo story end to end: one
real run of it (the bot, a local instance, the tiny trainer interrupted and resumed: ~10 s of CPU, half a minute of wall
time) serves them all. Each test then goes on from a copy of the checkout that run left (:func:`after_the_demo`).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.runner_harness import made_once

ROOT = Path(__file__).resolve().parent.parent
MAKE_DEMO = re.compile(r"^make demo\b.*$", re.M)


def checkout_after_make(folder: Path) -> Path:
    """A folder laid out as a checkout after ``make``, its ``.venv`` this interpreter's, stamped as installed."""
    folder.mkdir(exist_ok=True)
    for name in ("Makefile", "pyproject.toml", "VERSION", "bench"):
        (folder / name).symlink_to(ROOT / name)
    venv = folder / ".venv"
    venv.mkdir()
    (venv / "bin").symlink_to(Path(sys.prefix) / "bin")
    for stamp in (".installed", ".installed-demo"):  # newer than pyproject.toml and VERSION: make installs nothing
        (venv / stamp).touch()
    return folder


def reader_env() -> dict[str, str]:
    """The environment the blocks run in: this checkout's code, the trainer kept with the runner."""
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),  # this checkout's code, whatever the interpreter's install points at
        # pytest's temporary folders are private (0700): the trainer stays with the runner (tests/conftest.py)
        "FINETUNE_TRAINER_USER": os.environ.get("FINETUNE_TRAINER_USER", "root"),
    }
    env.pop("MAKEFLAGS", None)
    env.pop("MAKELEVEL", None)
    return env


@dataclass(frozen=True)
class Demo:
    """What ``make demo`` did in its checkout: its exit status and output, and the checkout as it left it."""

    checkout: Path
    status: int
    stdout: Path
    stderr: Path

    def said(self) -> str:
        return self.stdout.read_text()

    def failure(self) -> str:
        return f"make demo failed (exit {self.status}):\n{self.said()[-3000:]}\n{self.stderr.read_text()[-3000:]}"

    def after_the_demo(self, folder: Path, block: str) -> tuple[Path, str]:
        """A copy of the demo's checkout in ``folder``, and ``block`` with its ``make demo`` line replaced by that
        run's output: the reader's later commands run where the demo ran, after it."""
        assert MAKE_DEMO.search(block), f"the block runs no make demo:\n{block}"
        shutil.copytree(self.checkout, folder, symlinks=True)
        output = f"cat {shlex.quote(str(self.stdout))}; cat {shlex.quote(str(self.stderr))} >&2"
        return folder, MAKE_DEMO.sub(lambda _: output, block)


def _run_make_demo(folder: Path) -> None:
    checkout = checkout_after_make(folder / "checkout")
    done = subprocess.run(["make", "demo"], cwd=checkout, env=reader_env(), capture_output=True, text=True, timeout=280)
    (folder / "stdout").write_text(done.stdout)
    (folder / "stderr").write_text(done.stderr)
    (folder / "status.json").write_text(json.dumps(done.returncode))


def made_demo(tmp_path_factory: pytest.TempPathFactory) -> Demo:
    """``make demo`` in a fresh checkout, once for the whole run (the workers share it: ``made_once``)."""
    folder = made_once(tmp_path_factory, "make-demo", _run_make_demo)
    status = json.loads((folder / "status.json").read_text())
    return Demo(folder / "checkout", status, folder / "stdout", folder / "stderr")

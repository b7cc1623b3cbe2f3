"""Every command block of the local quickstart (docs/quickstart.md) runs, in order, as a reader types them.

The ```` ```sh ```` blocks (and the ``$`` lines of a ```` ```console ```` block) go into one bash script, run with
``-e`` in a folder laid out as a checkout after ``make``: the Makefile and pyproject.toml, ``bench/`` (the spot
traces), and ``.venv`` pointing at the interpreter running the tests, stamped as installed so ``make demo`` starts
at once. A block a test cannot type (the interactive chat) says so on the line before it with
``<!-- not run: interactive -->``; there may be at most :data:`MAX_NOT_RUN` of them.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
QUICKSTART = ROOT / "docs" / "quickstart.md"
NOT_RUN = "<!-- not run: interactive -->"
MAX_NOT_RUN = 1
COMMAND_LANGUAGES = ("sh", "console")
FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.M | re.S)


def command_blocks(text: str) -> tuple[list[str], list[str]]:
    """(blocks to run, blocks marked not run), each a block's commands as a reader types them."""
    run: list[str] = []
    skipped: list[str] = []
    for fence in FENCE.finditer(text):
        language, body = fence.group(1), fence.group(2)
        if language not in COMMAND_LANGUAGES:
            continue
        before = text[: fence.start()].rstrip().splitlines()
        marked = bool(before) and before[-1].strip() == NOT_RUN
        if language == "console":
            body = "".join(line[2:] + "\n" for line in body.splitlines() if line.startswith("$ "))
        (skipped if marked else run).append(body)
    return run, skipped


@pytest.mark.unit
def test_the_quickstart_marks_few_blocks_not_run_and_runs_the_rest() -> None:
    run, skipped = command_blocks(QUICKSTART.read_text())
    assert len(skipped) <= MAX_NOT_RUN, f"{len(skipped)} blocks marked not run; at most {MAX_NOT_RUN}"
    joined = "\n".join(run)
    for command in ("make demo", "finetune-bot chat", "finetune-bot simulate"):
        assert command in joined, f"the quickstart runs no {command}"


@pytest.mark.unit
def test_blocks_are_read_as_a_reader_types_them() -> None:
    text = (
        "```sh\nmake demo\n```\n\n```text\noutput\n```\n\n"
        f"{NOT_RUN}\n```console\n$ finetune-bot chat\n/finetune help\n```\n\n"
        "```console\n$ finetune-bot --help\nusage: …\n```\n"
    )
    assert command_blocks(text) == (["make demo\n", "finetune-bot --help\n"], ["finetune-bot chat\n"])


def checkout_after_make(folder: Path) -> Path:
    """A folder laid out as a checkout after ``make``, its ``.venv`` this interpreter's, stamped as installed."""
    for name in ("Makefile", "pyproject.toml", "VERSION", "bench"):
        (folder / name).symlink_to(ROOT / name)
    venv = folder / ".venv"
    venv.mkdir()
    (venv / "bin").symlink_to(Path(sys.prefix) / "bin")
    for stamp in (".installed", ".installed-demo"):  # newer than pyproject.toml and VERSION: make installs nothing
        (venv / stamp).touch()
    return folder


@pytest.mark.scenario
def test_every_command_block_of_the_quickstart_runs(tmp_path: Path) -> None:
    run, _ = command_blocks(QUICKSTART.read_text())
    script = ["set -eo pipefail"]
    for number, block in enumerate(run, start=1):
        script += [f"echo '### block {number}' >&2", block]
    (tmp_path / "checkout").mkdir()
    folder = checkout_after_make(tmp_path / "checkout")
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),  # this checkout's code, whatever the interpreter's install points at
        # pytest's temporary folders are private (0700): the trainer stays with the runner (tests/conftest.py)
        "FINETUNE_TRAINER_USER": os.environ.get("FINETUNE_TRAINER_USER", "root"),
    }
    env.pop("MAKEFLAGS", None)
    env.pop("MAKELEVEL", None)
    done = subprocess.run(
        ["bash", "-c", "\n".join(script)], cwd=folder, env=env, capture_output=True, text=True, timeout=280
    )
    reached = re.findall(r"^### block (\d+)$", done.stderr, re.M)
    assert done.returncode == 0, (
        f"quickstart block {reached[-1] if reached else '?'} failed (exit {done.returncode}):\n"
        f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )
    assert reached == [str(number) for number in range(1, len(run) + 1)]
    out = done.stdout
    assert "✔ finished" in out and "✘" not in out  # make demo's checklist
    assert "⛔ steps=999999 is above the maximum 10000" in out  # the chat's answer to a mistake
    assert '"policy": "deadline-aware"' in out and '"met_deadline": true' in out  # simulate's lines

"""The trainer's progress file is read as a stranger's: never through a link, never blocking, never unbounded.

The file lies in the work directory, where the trainer may put anything under its name: a FIFO (an ``open`` for
reading waits for a writer), a link to a file of root's, a line that never ends.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
from pathlib import Path

import pytest

from runner.progress import LINE_LIMIT, READ_LIMIT, ProgressTail

pytestmark = pytest.mark.unit


def line(step: int) -> bytes:
    return json.dumps({"step": step, "total_steps": 100, "loss": 0.5}).encode() + b"\n"


async def test_a_fifo_is_not_waited_on(tmp_path: Path) -> None:
    path = tmp_path / "progress.jsonl"
    os.mkfifo(path)
    tail = ProgressTail(path)
    # A blocking open would wait for a writer forever; the hang guard only turns such a hang into a failure.
    await asyncio.wait_for(tail.refresh(), 60)
    assert tail.state.step is None
    path.unlink()
    path.write_bytes(line(3))  # the trainer made it a file again: read as before
    await asyncio.wait_for(tail.refresh(), 60)
    assert tail.state.step == 3


async def test_a_fifo_held_open_by_a_writer_is_not_read_either(tmp_path: Path) -> None:
    path = tmp_path / "progress.jsonl"
    os.mkfifo(path)
    reader = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    writer = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    try:
        os.write(writer, line(9))
        tail = ProgressTail(path)
        await asyncio.wait_for(tail.refresh(), 60)
        assert tail.state.step is None  # only a regular file is read
    finally:
        os.close(writer)
        os.close(reader)


def test_a_link_is_not_followed(tmp_path: Path) -> None:
    elsewhere = tmp_path / "root-only.jsonl"
    elsewhere.write_bytes(line(7))
    path = tmp_path / "progress.jsonl"
    path.symlink_to(elsewhere)
    tail = ProgressTail(path)
    tail.read_new()
    assert tail.state.step is None


def test_a_huge_line_is_skipped_a_bounded_piece_at_a_time(tmp_path: Path) -> None:
    path = tmp_path / "progress.jsonl"
    huge = b'{"step": 999, "pad": "' + b"x" * (3 * READ_LIMIT) + b'"}\n'
    path.write_bytes(line(1) + huge + line(2))
    tail = ProgressTail(path)
    offsets = [0]
    steps = []
    for _ in range(10):
        tail.read_new()
        offsets.append(tail._offset)
        steps.append(tail.state.step)
    # Never more than READ_LIMIT bytes taken in one call, the huge line never parsed, the next line read.
    assert max(after - before for before, after in itertools.pairwise(offsets)) <= READ_LIMIT
    assert 999 not in steps and steps[0] == 1 and steps[-1] == 2
    assert tail._offset == path.stat().st_size


def test_a_long_line_that_ends_within_one_read_is_skipped_and_the_rest_read(tmp_path: Path) -> None:
    path = tmp_path / "progress.jsonl"
    long = b'{"step": 500, "pad": "' + b"y" * (2 * LINE_LIMIT) + b'"}\n'
    path.write_bytes(line(4) + long + line(5))
    tail = ProgressTail(path)
    tail.read_new()
    assert tail.state.step == 5


def test_a_half_written_line_waits_and_a_truncated_file_is_read_from_its_start(tmp_path: Path) -> None:
    path = tmp_path / "progress.jsonl"
    path.write_bytes(line(1) + b'{"step": 2')
    tail = ProgressTail(path)
    tail.read_new()
    assert tail.state.step == 1
    with path.open("ab") as file:
        file.write(b', "total_steps": 100}\n')
    tail.read_new()
    assert tail.state.step == 2
    path.write_bytes(line(3))  # a new trainer started the file again
    tail.read_new()
    assert tail.state.step == 3

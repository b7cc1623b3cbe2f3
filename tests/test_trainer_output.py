"""The trainer's output: all of it in the log file, a bounded tail in memory (what a ``failed`` report carries)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from runner.trainer import LINE_LIMIT, TrainerFiles, TrainerProcess

# 8 MiB without a line end (a binary blob, a progress bar that never returns), then two short lines.
NO_LINE_END = "import sys; sys.stdout.write('x' * (8 << 20)); sys.stdout.write('\\nafter\\nlast')"


@pytest.mark.scenario
async def test_a_line_without_end_is_kept_by_its_start_and_the_log_still_has_every_byte(tmp_path: Path) -> None:
    files = TrainerFiles.under(tmp_path / "work")
    trainer = await TrainerProcess.start([sys.executable, "-c", NO_LINE_END], {}, None, files, echo=False)
    assert await trainer.wait() == 0
    assert list(trainer.tail) == ["x" * LINE_LIMIT, "after", "last"]
    assert files.log_path.stat().st_size == (8 << 20) + len("\nafter\nlast")

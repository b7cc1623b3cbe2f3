"""The real tiny trainer (``python -m runner.hf.tiny``) against the trainer contract the runner relies on.

Every test runs the trainer as a subprocess, the way the runner does. Loading torch + transformers + peft costs
a few seconds per process, so the uninterrupted reference run is started once per module and overlaps the
interrupted run of the SIGTERM test (which is defined first for that reason).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.scenario  # every test here runs a subprocess (tests/markers.py)

REPO = Path(__file__).resolve().parents[1]
MARKER = ".finetune-complete"
ADAPTER = "adapter_model.safetensors"
MAX_STEPS = 30  # 16 steps per epoch (64 sequences / batch 4): two epochs
SAVE_STEPS = 5
ARGS = ["--max-steps", str(MAX_STEPS), "--save-steps", str(SAVE_STEPS)]
PROCESS_TIMEOUT = 180.0


class TrainerRun:
    """One ``python -m runner.hf.tiny`` subprocess with its own output dir, progress file and log."""

    def __init__(self, base: Path, *extra: str, resume_from: Path | None = None) -> None:
        base.mkdir(parents=True, exist_ok=True)
        self.output_dir = base / "output"
        self.progress = base / "progress.jsonl"
        self.log = base / "trainer.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("FINETUNE_")}
        env.update(
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
            HF_DATASETS_OFFLINE="1",
            FINETUNE_OUTPUT_DIR=str(self.output_dir),
            FINETUNE_PROGRESS_FILE=str(self.progress),
            FINETUNE_RESUME_FROM=str(resume_from) if resume_from is not None else "",
        )
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "runner.hf.tiny", *ARGS, *extra],
                cwd=REPO,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def wait(self) -> int:
        try:
            return self.proc.wait(timeout=PROCESS_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"trainer still running after {PROCESS_TIMEOUT}s:\n{self.log_tail()}") from None

    def finish(self) -> None:
        """Wait for a successful exit, or fail with the end of the trainer's log."""
        code = self.wait()
        assert code == 0, f"trainer exited {code}:\n{self.log_tail()}"

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def summary(self) -> dict[str, Any]:
        """The JSON line the trainer prints last: {"global_step": int, "interrupted": bool}."""
        last: dict[str, Any] = json.loads(self.log.read_text().strip().splitlines()[-1])
        return last

    def progress_lines(self) -> list[dict[str, Any]]:
        if not self.progress.exists():
            return []
        text = self.progress.read_text()
        complete = text[: text.rfind("\n") + 1]  # ignore a line still being written
        return [json.loads(line) for line in complete.splitlines()]

    def checkpoint_steps(self) -> list[int]:
        return sorted(int(p.name.split("-", 1)[1]) for p in self.output_dir.glob("checkpoint-*") if p.is_dir())

    def wait_for_step(self, step: int, timeout: float = 120.0) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            lines = self.progress_lines()
            if lines and lines[-1]["step"] >= step:
                return int(lines[-1]["step"])
            assert self.proc.poll() is None, f"trainer exited before step {step}:\n{self.log_tail()}"
            time.sleep(0.02)
        raise AssertionError(f"no progress up to step {step} after {timeout}s:\n{self.log_tail()}")


def assert_same_adapter(left: Path, right: Path) -> None:
    import torch  # here, not at the top: every xdist worker collects this file, few run it
    from safetensors.torch import load_file

    a, b = load_file(str(left)), load_file(str(right))
    assert a.keys() == b.keys()
    different = [name for name in a if not torch.equal(a[name], b[name])]
    assert not different, f"tensors differ between {left} and {right}: {different}"


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TrainerRun]:
    """An uninterrupted run; started here, waited for by the tests that read its results."""
    run = TrainerRun(tmp_path_factory.mktemp("reference"))
    yield run
    run.kill()


def test_sigterm_saves_a_marked_checkpoint_and_resume_is_bitwise_equal(reference: TrainerRun, tmp_path: Path) -> None:
    first = TrainerRun(tmp_path / "first", "--step-seconds", "0.2")
    try:
        # In the second epoch (steps 17..30): a resume replaying the first epoch's data order would show.
        seen = first.wait_for_step(17)
        first.proc.send_signal(signal.SIGTERM)
        first.finish()
    finally:
        first.kill()
    stopped_at = first.summary()
    assert stopped_at["interrupted"] is True
    step = stopped_at["global_step"]
    assert seen <= step < MAX_STEPS

    # The checkpoint of the very step it stopped at (off the --save-steps grid unless by chance), complete.
    checkpoints = first.checkpoint_steps()
    assert checkpoints[-1] == step
    assert checkpoints == sorted({*range(SAVE_STEPS, step + 1, SAVE_STEPS), step})
    newest = first.output_dir / f"checkpoint-{step}"
    assert (newest / MARKER).is_file() and (newest / MARKER).stat().st_size == 0
    assert (newest / ADAPTER).is_file() and (newest / "optimizer.pt").is_file()
    assert all((first.output_dir / f"checkpoint-{s}" / MARKER).is_file() for s in checkpoints)
    # Interrupted: no final output outside the checkpoint dirs.
    assert not (first.output_dir / ADAPTER).exists()
    assert not (first.output_dir / "adapter_config.json").exists()
    assert first.progress_lines()[-1]["step"] == step

    # A fresh process in a new output dir resumes from that checkpoint, in the middle of the second epoch.
    resumed = TrainerRun(tmp_path / "resumed", resume_from=newest)
    resumed.finish()
    assert resumed.summary() == {"global_step": MAX_STEPS, "interrupted": False}
    resumed_steps = [line["step"] for line in resumed.progress_lines()]
    assert resumed_steps == list(range(step + 1, MAX_STEPS + 1))
    assert resumed.checkpoint_steps() == [s for s in range(SAVE_STEPS, MAX_STEPS + 1, SAVE_STEPS) if s > step]

    reference.finish()
    assert_same_adapter(resumed.output_dir / ADAPTER, reference.output_dir / ADAPTER)


def test_uninterrupted_run_writes_marked_checkpoints_progress_and_the_adapter(reference: TrainerRun) -> None:
    reference.finish()
    assert reference.summary() == {"global_step": MAX_STEPS, "interrupted": False}
    out = reference.output_dir

    assert (out / ADAPTER).is_file() and (out / "adapter_config.json").is_file()
    assert json.loads((out / "adapter_config.json").read_text())["peft_type"] == "LORA"
    from safetensors.torch import load_file  # torch: only in the worker that runs this

    final = load_file(str(out / ADAPTER))
    assert any("lora_B" in name for name in final)
    assert all(final[name].abs().sum() > 0 for name in final if "lora_B" in name)  # B starts at 0: it trained

    assert reference.checkpoint_steps() == list(range(SAVE_STEPS, MAX_STEPS + 1, SAVE_STEPS))
    for step in reference.checkpoint_steps():
        checkpoint = out / f"checkpoint-{step}"
        assert (checkpoint / MARKER).is_file(), checkpoint
        assert json.loads((checkpoint / "trainer_state.json").read_text())["global_step"] == step
    # The last checkpoint holds exactly the final weights; an earlier one does not.
    assert_same_adapter(out / f"checkpoint-{MAX_STEPS}" / ADAPTER, out / ADAPTER)
    with pytest.raises(AssertionError):
        assert_same_adapter(out / f"checkpoint-{SAVE_STEPS}" / ADAPTER, out / ADAPTER)

    lines = reference.progress_lines()
    assert [line["step"] for line in lines] == list(range(1, MAX_STEPS + 1))
    for line in lines:
        assert set(line) == {"step", "total_steps", "loss", "epoch"}
        assert line["total_steps"] == MAX_STEPS
        assert isinstance(line["loss"], float) and isinstance(line["epoch"], float)
    assert lines[15]["epoch"] == pytest.approx(1.0)  # step 16 ends the first epoch
    losses = [line["loss"] for line in lines]
    assert sum(losses[-5:]) < sum(losses[:5])  # it learns something


def test_resuming_from_the_final_checkpoint_only_exports_the_adapter(reference: TrainerRun, tmp_path: Path) -> None:
    """E.g. the notice arrived after the last step: that run kept checkpoint-30 but wrote no final output."""
    reference.finish()
    again = TrainerRun(tmp_path / "again", resume_from=reference.output_dir / f"checkpoint-{MAX_STEPS}")
    again.finish()
    assert again.summary() == {"global_step": MAX_STEPS, "interrupted": False}
    assert again.progress_lines() == []  # no extra optimizer step (a plain resume would run step 31)
    assert again.checkpoint_steps() == []
    assert_same_adapter(again.output_dir / ADAPTER, reference.output_dir / ADAPTER)

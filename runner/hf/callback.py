"""Make any Hugging Face ``Trainer`` spot-safe: checkpoint on SIGTERM, mark finished checkpoints, report progress.

The runner agent starts the training command with three environment variables and relies on this contract:

* ``FINETUNE_OUTPUT_DIR``: where the trainer writes ``checkpoint-<step>/`` directories (the HF Trainer layout,
  i.e. ``TrainingArguments.output_dir``). A checkpoint directory is *complete* once it holds the empty marker
  file ``.finetune-complete``, which this callback writes after the Trainer has finished saving it.
* ``FINETUNE_RESUME_FROM``: a restored checkpoint directory to resume from (empty / unset = start fresh); pass
  it to ``trainer.train(resume_from_checkpoint=...)``.
* ``FINETUNE_PROGRESS_FILE`` (optional): this callback appends one JSON line per step to it:
  ``{"step": int, "total_steps": int, "loss": float | null, "epoch": float | null}``.

On SIGTERM (sent by the runner when a spot interruption notice arrives) the callback only sets a flag; at the
next optimizer-step boundary it asks the Trainer to save a checkpoint and stop. The script must then *not*
write its final output (check ``callback.stop_requested`` after ``trainer.train()``) and may exit 0.

Adding it to a script, in one line:

* plain HF ``Trainer`` (or TRL's ``SFTTrainer`` and friends)::

      trainer.add_callback(SpotCheckpointCallback())   # or Trainer(..., callbacks=[SpotCheckpointCallback()])

  with ``output_dir=os.environ["FINETUNE_OUTPUT_DIR"]``, ``save_strategy="steps"`` and
  ``trainer.train(resume_from_checkpoint=os.environ.get("FINETUNE_RESUME_FROM") or None)``.
* ms-swift 4.x: in a file passed with ``--external_plugins``::

      callbacks_map["spot_checkpoint"] = SpotCheckpointCallback   # then: swift sft --callbacks spot_checkpoint

  (``from swift.callbacks.mapping import callbacks_map``; ms-swift constructs it as ``cls(args, trainer)``,
  which the constructor accepts and ignores). ms-swift 3.x: ``extra_callbacks.append(SpotCheckpointCallback())``
  in ``swift/plugin/callback.py``. Also pass ``--output_dir $FINETUNE_OUTPUT_DIR --add_version false`` (so
  checkpoints land directly in the output dir) and ``--resume_from_checkpoint $FINETUNE_RESUME_FROM``.

Only trainer processes import this module, but it still imports nothing heavier than ``transformers`` at the
top level. Under multi-process training every rank installs the handler (the runner signals the whole process
group), while only the world-process-zero writes the marker and the progress file.
"""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import threading
from types import FrameType
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

__all__ = ["COMPLETE_MARKER", "SpotCheckpointCallback", "checkpoint_dir"]

log = logging.getLogger(__name__)

COMPLETE_MARKER = ".finetune-complete"
"""Empty file written into a checkpoint directory once the Trainer has finished saving it."""


def checkpoint_dir(output_dir: str, step: int) -> str:
    """Where the HF Trainer saves the checkpoint of ``step``.

    Mirrors ``Trainer._save_checkpoint`` in transformers 5.x: ``os.path.join(run_dir, f"checkpoint-{step}")``
    with ``run_dir == args.output_dir`` (it differs only inside a hyper-parameter search trial).
    """
    return os.path.join(output_dir, f"{PREFIX_CHECKPOINT_DIR}-{step}")


class SpotCheckpointCallback(TrainerCallback):
    """Checkpoint-and-stop on SIGTERM, completion markers on every checkpoint, JSON-lines progress.

    Attributes:
        stop_requested: a SIGTERM has been received (at any time, even after the last step).
        interrupted: this callback has acted on the flag (asked the Trainer to save and stop at a step end).
        progress_file: the JSON-lines progress path (``FINETUNE_PROGRESS_FILE`` by default), or None.
    """

    def __init__(
        self,
        *_ignored: Any,
        progress_file: str | None = None,
        install_signal_handler: bool = True,
    ) -> None:
        """Install the SIGTERM handler (SIGINT keeps its default behaviour).

        Positional arguments are accepted and ignored so that frameworks which construct callbacks as
        ``cls(args, trainer)`` (ms-swift 4.x) can use the class directly.

        Args:
            progress_file: where to append progress lines; defaults to ``$FINETUNE_PROGRESS_FILE`` (unset or
                empty = no progress file).
            install_signal_handler: set False to install nothing (e.g. when the caller routes signals itself
                and calls :meth:`request_stop`).
        """
        super().__init__()
        self.stop_requested: bool = False
        self.interrupted: bool = False
        if progress_file is None:
            progress_file = os.environ.get("FINETUNE_PROGRESS_FILE") or None
        self.progress_file: str | None = progress_file
        if install_signal_handler:
            if threading.current_thread() is threading.main_thread():
                signal.signal(signal.SIGTERM, self._handle_sigterm)
            else:  # signal.signal() only works in the main thread
                log.warning("SpotCheckpointCallback created outside the main thread: SIGTERM handler not installed")

    # -- signal side ---------------------------------------------------------------------------------------

    def _handle_sigterm(self, signum: int, frame: FrameType | None) -> None:
        # Only set a flag: the Trainer may be in the middle of a backward pass or writing a checkpoint.
        self.stop_requested = True

    def request_stop(self) -> None:
        """Same as receiving SIGTERM: checkpoint at the next step boundary and stop."""
        self.stop_requested = True

    # -- Trainer events ------------------------------------------------------------------------------------

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> TrainerControl:
        if self.stop_requested and not self.interrupted:
            self.interrupted = True
            control.should_save = True
            control.should_training_stop = True
            log.warning("SIGTERM received: saving checkpoint at step %d and stopping", state.global_step)
        # DefaultFlowCallback runs before us: if it asked for a log, on_log follows for this same step with the
        # loss, so skip the loss-less line to keep one line per step.
        if not control.should_log:
            self._write_progress(state, loss=None)
        return control

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> TrainerControl:
        # The end-of-training summary (train_loss, train_runtime, ...) and eval logs carry no "loss".
        if logs and "loss" in logs:
            self._write_progress(state, loss=logs["loss"])
        return control

    def on_save(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> TrainerControl:
        # on_save runs on every rank right after Trainer._save_checkpoint (model, optimizer, scheduler, RNG
        # state, trainer_state.json) has returned; the files are written by the main process only.
        if not state.is_world_process_zero or args.output_dir is None:
            return control
        path = checkpoint_dir(args.output_dir, state.global_step)
        if not os.path.isdir(path):
            log.warning("checkpoint directory %s not found; no %s marker written", path, COMPLETE_MARKER)
            return control
        marker = os.path.join(path, COMPLETE_MARKER)
        fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        return control

    # -- progress ------------------------------------------------------------------------------------------

    def _write_progress(self, state: TrainerState, loss: Any) -> None:
        if self.progress_file is None or not state.is_world_process_zero:
            return
        record = {
            "step": int(state.global_step),
            "total_steps": int(state.max_steps),
            "loss": _finite_or_none(loss),
            "epoch": _finite_or_none(state.epoch),
        }
        try:
            with open(self.progress_file, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(record) + "\n")
                fh.flush()
        except OSError as exc:  # progress is best effort: never kill a training run over it
            log.warning("cannot append to progress file %s: %s", self.progress_file, exc)


def _finite_or_none(value: Any) -> float | None:
    """A JSON-safe float (NaN / inf / non-numbers become None)."""
    if value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None

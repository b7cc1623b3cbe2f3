"""Make any Hugging Face ``Trainer`` spot-safe: checkpoint on the runner's stop request, mark finished checkpoints.

The runner agent starts the training command with these environment variables and relies on this contract:

* ``FINETUNE_OUTPUT_DIR``: where the trainer writes ``checkpoint-<step>/`` directories (the HF Trainer layout,
  i.e. ``TrainingArguments.output_dir``). A checkpoint directory is *complete* once it holds the empty marker
  file ``.finetune-complete``, which this callback writes after every rank has finished saving it. Once the ranks
  agreed to stop on a request it also writes ``$FINETUNE_STOP_FILE.stopped`` (a gang node's runner then knows its
  trainer ended on a peer's notice).
* ``FINETUNE_RESUME_FROM``: a restored checkpoint directory to resume from (empty / unset = start fresh); pass
  it to ``trainer.train(resume_from_checkpoint=...)``.
* ``FINETUNE_PROGRESS_FILE`` (optional): this callback appends one JSON line per step to it:
  ``{"step": int, "total_steps": int, "loss": float | null, "epoch": float | null}``.
* ``FINETUNE_STOP_FILE``: the runner's stop request (see ``runner.stop_request``); it exists once the job must
  stop. A SIGTERM means the same. ``$FINETUNE_STOP_FILE.save`` is the runner's save request (``runner.save_request``):
  save a checkpoint at the next step boundary and train on (an early signal: a rebalance, a scheduled event).

At every optimizer-step boundary the callback looks for the request; under ``torch.distributed`` the ranks
agree on it first (an all-reduce), so every rank stops after the same step. Then it asks the Trainer to save a
checkpoint and stop. A request that arrives while a periodic checkpoint is being written ends training right
after that save (``on_save``): that checkpoint is the newest state, and the runner commits it. The script must
then *not* write its final output (check ``callback.stopped()`` after
``trainer.train()``) and may exit 0.

Adding it to a script, in one line:

* plain HF ``Trainer`` (or TRL's ``SFTTrainer`` and friends), also under torchrun / ``accelerate launch``::

      trainer.add_callback(SpotCheckpointCallback())   # or Trainer(..., callbacks=[SpotCheckpointCallback()])

  with ``output_dir=os.environ["FINETUNE_OUTPUT_DIR"]``, ``save_strategy="steps"`` and
  ``trainer.train(resume_from_checkpoint=os.environ.get("FINETUNE_RESUME_FROM") or None)``.
* ms-swift 4.x: nothing to copy. ``runner/swift/finetune_spot_plugin.py`` registers this class in swift's
  ``callbacks_map`` as ``spot_checkpoint``; the runner puts that file's path in ``${FINETUNE_SWIFT_PLUGIN}``, so a
  recipe passes
  ``--external_plugins ${FINETUNE_SWIFT_PLUGIN} --callbacks spot_checkpoint`` (ms-swift constructs the callback
  as ``cls(args, trainer)``, which the constructor accepts and ignores), plus ``--output_dir
  ${FINETUNE_OUTPUT_DIR} --add_version false`` and ``--resume_from_checkpoint ${FINETUNE_RESUME_FROM}``.

Exact resume. The checkpoint holds the RNG states and the Trainer restores them, but a DataLoader with
``persistent_workers`` and ``num_workers > 0`` (ms-swift's default) draws its iterator's base seed from the
global RNG only when its workers first start: an uninterrupted run does that once, before epoch 0, while a run
resumed inside an epoch finishes that epoch on a fresh skipping loader and starts the original loader's workers
at the next epoch, one extra draw from the global RNG. From then on every dropout mask (``lora_dropout``) differs.
With ``dataloader_persistent_workers=False`` each epoch's iterator draws in both runs and the resumed run stays
bitwise equal; the callback warns when the setting would break that.

Only trainer processes import this module, but it still imports nothing heavier than ``transformers`` at the
top level (torch only when the ranks are distributed). Under multi-process training every rank watches the
request, while only each node's local process zero writes the marker and the progress file (one node: the
world-process-zero).
"""

from __future__ import annotations

import json
import logging
import math
import os
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from runner.save_request import SaveRequest
from runner.stop_request import StopRequest, agree_max, barrier

__all__ = ["COMPLETE_MARKER", "SpotCheckpointCallback", "checkpoint_dir"]

log = logging.getLogger(__name__)

COMPLETE_MARKER = ".finetune-complete"
"""Empty file written into a checkpoint directory once every rank has finished saving it."""


def checkpoint_dir(output_dir: str, step: int) -> str:
    """Where the HF Trainer saves the checkpoint of ``step``.

    Mirrors ``Trainer._save_checkpoint`` in transformers 5.x (and ms-swift's override of it):
    ``os.path.join(output_dir, f"checkpoint-{step}")`` (it differs only inside a hyper-parameter search trial).
    """
    return os.path.join(output_dir, f"{PREFIX_CHECKPOINT_DIR}-{step}")


class SpotCheckpointCallback(TrainerCallback):
    """Checkpoint-and-stop on the runner's request, completion markers on every checkpoint, JSON-lines progress.

    Attributes:
        stop: the stop request this callback watches (the runner's file and SIGTERM).
        interrupted: every rank has agreed to stop, and the Trainer was asked to save and stop at this step.
        progress_file: the JSON-lines progress path (``FINETUNE_PROGRESS_FILE`` by default), or None.
    """

    def __init__(
        self,
        *_ignored: Any,
        progress_file: str | None = None,
        install_signal_handler: bool = True,
        stop_file: str | None = None,
    ) -> None:
        """Start watching the stop request; install the SIGTERM handler (SIGINT keeps its default behaviour).

        Positional arguments are accepted and ignored so that frameworks which construct callbacks as
        ``cls(args, trainer)`` (ms-swift 4.x) can use the class directly.

        Args:
            progress_file: where to append progress lines; defaults to ``$FINETUNE_PROGRESS_FILE`` (unset or
                empty = no progress file).
            install_signal_handler: set False to install nothing (e.g. when the caller routes signals itself
                and calls :meth:`request_stop`).
            stop_file: the runner's stop request file; defaults to ``$FINETUNE_STOP_FILE``.
        """
        super().__init__()
        self.stop = StopRequest(stop_file, install_signal_handler=install_signal_handler)
        self.save = SaveRequest(stop_file)  # the runner's "save now, keep training" (an early signal)
        self.interrupted: bool = False
        if progress_file is None:
            progress_file = os.environ.get("FINETUNE_PROGRESS_FILE") or None
        self.progress_file: str | None = progress_file

    @property
    def stop_requested(self) -> bool:
        """This process has seen a stop request (at any time, even after the last step)."""
        return self.stop.requested

    def request_stop(self) -> None:
        """Same as receiving SIGTERM: checkpoint at the next step boundary and stop."""
        self.stop.request()

    def stopped(self) -> bool:
        """After ``trainer.train()``: whether the job was asked to stop, so this run must not write its final output.

        The same answer on every rank (a collective under ``torch.distributed``: call it on all of them).
        """
        stopped = self.interrupted or self.stop.agreed()
        if stopped:
            self.stop.mark_stopped()
        return stopped

    # -- Trainer events ------------------------------------------------------------------------------------

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> TrainerControl:
        persistent = getattr(args, "dataloader_persistent_workers", False) and args.dataloader_num_workers > 0
        if persistent and state.num_train_epochs > 1 and state.is_world_process_zero:
            log.warning(
                "dataloader_persistent_workers with %d workers: a run resumed inside an epoch draws the next "
                "epoch's loader seed from the global RNG once more than an uninterrupted run, so dropout differs "
                "after the epoch boundary; set dataloader_persistent_workers=False for an exact resume",
                args.dataloader_num_workers,
            )
        return control

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> TrainerControl:
        # Every rank calls this after every optimizer step, so the agreement (a collective) is safe here.
        # One collective for both requests: the ranks agree on the stop and on the newest save request at once.
        stop, save = (0, 0) if self.interrupted else agree_max([int(self.stop.requested), self.save.asked()])
        if stop:
            self.interrupted = True
            control.should_save = True
            control.should_training_stop = True
            self.stop.mark_stopped()
            log.warning("stop requested: saving checkpoint at step %d and stopping", state.global_step)
        elif self.save.honour(save):
            control.should_save = True
            log.warning("save requested (an early signal): saving at step %d, training on", state.global_step)
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
        # on_save runs on every rank right after Trainer._save_checkpoint returned there. Each rank writes files
        # of its own (rng_state_<rank>.pth; shards under FSDP / DeepSpeed), so wait for all of them: only then is
        # the checkpoint complete, and rank 0 says so once.
        barrier()
        # Each node's local rank 0: on several nodes without a shared disk each node's directory is its own part.
        if state.is_local_process_zero and args.output_dir is not None:
            _mark_complete(checkpoint_dir(args.output_dir, state.global_step))
        # A stop requested while this checkpoint was being written (a notice during a periodic save): it holds the
        # newest state there is, so training ends here. A step more would need a save of its own, which the
        # deadline may not leave time for. The same answer on every rank (on_save is called on all of them).
        if not self.interrupted and self.stop.agreed():
            self.interrupted = True
            control.should_training_stop = True
            self.stop.mark_stopped()
            log.warning("stop requested during the save of step %d: stopping after it", state.global_step)
        return control

    # -- progress ------------------------------------------------------------------------------------------

    def _write_progress(self, state: TrainerState, loss: Any) -> None:
        if self.progress_file is None or not state.is_local_process_zero:  # each node's runner reads its own
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


def _mark_complete(path: str) -> None:
    """Write the completion marker into a checkpoint directory every rank has finished writing."""
    if not os.path.isdir(path):
        log.warning("checkpoint directory %s not found; no %s marker written", path, COMPLETE_MARKER)
        return
    fd = os.open(os.path.join(path, COMPLETE_MARKER), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _finite_or_none(value: Any) -> float | None:
    """A JSON-safe float (NaN / inf / non-numbers become None)."""
    if value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None

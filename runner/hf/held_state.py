"""A data-parallel rank whose world broke (a peer lost without notice) saves the step it holds, with no collective.

Every rank of a data-parallel run holds the same weights, optimizer and scheduler state after each optimizer step
(DDP all-reduces the gradients, then each rank steps alike). A collective that fails because a peer is gone fails
before the next step changes anything (the gradients' all-reduce comes before the optimizer's step; the stop
agreement and the loss's gather come after the step is done), so what the rank holds is the state after
``state.global_step``: the checkpoint the world would have saved at that step, except for what only the lost ranks
held. :func:`save_held` writes it into ``checkpoint-<step>/`` on each node's local process zero, marks it held
(:data:`runner.held.HELD_MARKER`) and complete, and the runner commits it as the gang's checkpoint.

What only a lost rank held is its RNG state (its data order is the shared sampler's, a function of the seed and the
step): ``rng_state_<rank>.pth``. A trainer whose every rank reseeds at each step from ``(seed, step, rank)``
(:class:`StepSeedCallback`; the ``tiny`` recipe) passes ``seed`` and every rank's file is written by that rule;
otherwise only this rank's own is written, and the runner takes a lost rank's from its node's last committed part.

Trainer processes only (it imports torch).
"""

from __future__ import annotations

import json
import logging
import os
import warnings
from typing import Any

import torch
import torch.distributed as dist
from transformers import Trainer, TrainerCallback, TrainerControl, TrainerState, TrainingArguments, set_seed
from transformers.trainer_callback import ExportableState

from runner.held import DERIVED, HELD_MARKER
from runner.manifest import COMPLETE_MARKER

log = logging.getLogger(__name__)

BROKEN_WORDS = ("connection closed", "connection reset", "timed out", "timeout", "broken pipe", "peer", "gloo", "nccl")


def step_seed(seed: int, step: int, rank: int) -> int:
    """The seed of ``rank``'s RNG for the optimizer step after ``step``: a pure function of the three."""
    return (seed * 1_000_003 + step * 7_919 + rank * 104_729) % (2**32)


class StepSeedCallback(TrainerCallback):
    """Reseed every RNG at each step's start from ``(seed, step, rank)``: a rank's RNG stream is then rebuilt by
    rule, wherever the step was (a lost rank's included), instead of being state only that rank held."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        self.seed = seed

    def on_step_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> TrainerControl:
        _seed_all(step_seed(self.seed, state.global_step, args.process_index))
        return control


def _seed_all(value: int) -> None:
    set_seed(value)  # Python's, numpy's and torch's generators (every device's)


def world_broke(error: BaseException) -> bool:
    """Whether ``error`` is a collective that failed because the world is gone (a peer lost, or its timeout)."""
    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return False
    if isinstance(error, dist.DistError):
        return True
    text = str(error).lower()
    return isinstance(error, RuntimeError) and any(word in text for word in BROKEN_WORDS)


def save_held(trainer: Trainer, seed: int | None) -> str | None:
    """``checkpoint-<global step>/`` from what this rank holds, marked held and complete (each node's local process
    zero; None elsewhere). ``seed``: every rank's RNG is :func:`step_seed`'s (:class:`StepSeedCallback`), so every
    rank's ``rng_state_<rank>.pth`` is written by that rule; None: only this rank's own."""
    args, state = trainer.args, trainer.state
    assert args.output_dir is not None
    step = state.global_step
    folder = os.path.join(args.output_dir, f"checkpoint-{step}")
    if not state.is_local_process_zero:
        return None
    os.makedirs(folder, exist_ok=True)
    for stale in (COMPLETE_MARKER, HELD_MARKER):  # a periodic save this break cut short: written anew below
        if os.path.exists(os.path.join(folder, stale)):
            os.unlink(os.path.join(folder, stale))
    trainer._save(folder)  # the model (the adapter), on any rank: no collective for plain data-parallel
    assert trainer.optimizer is not None and trainer.lr_scheduler is not None
    torch.save(trainer.optimizer.state_dict(), os.path.join(folder, "optimizer.pt"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.save(trainer.lr_scheduler.state_dict(), os.path.join(folder, "scheduler.pt"))
    world = max(args.world_size, 1)
    if seed is None:
        trainer._save_rng_state(folder)
    else:
        own = os.path.join(folder, f"rng_state_{args.process_index}.pth" if world > 1 else "rng_state.pth")
        for rank in range(world):  # each in the Trainer's own format: seeded by the rule, saved as this rank's
            _seed_all(step_seed(seed, max(step - 1, 0), rank))  # as at the start of the step it holds
            trainer._save_rng_state(folder)
            os.replace(own, os.path.join(folder, f"rng_state_{rank}.pth" if world > 1 else "rng_state.pth"))
    exported: dict[str, Any] = state.stateful_callbacks  # type: ignore[assignment]  # a dict once training began
    for callback in [*trainer.callback_handler.callbacks, trainer.control]:
        if isinstance(callback, ExportableState):  # as Trainer._save_checkpoint updates them
            name = callback.__class__.__name__
            if isinstance(exported.get(name), list):
                exported[name].append(callback.state())
            else:
                exported[name] = callback.state()
    state.save_to_json(os.path.join(folder, "trainer_state.json"))
    held = {"step": step, "rank": args.process_index, "world": world, "rebuilt": DERIVED if seed is not None else None}
    with open(os.path.join(folder, HELD_MARKER), "w", encoding="utf-8") as fh:
        json.dump(held, fh)
    fd = os.open(os.path.join(folder, COMPLETE_MARKER), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    log.warning("the world broke after step %d: saved the step this rank holds in %s", step, folder)
    return folder

"""The tiny run's sharded full fine-tune (``--tuner full --sharded true``): every rank saves its own shard through
``torch.distributed.checkpoint`` (DCP), as a full fine-tune of a large model does.

A plain PyTorch loop (the trainers guide's "plain loop", :class:`runner.stop_request.StopRequest` and
:class:`runner.save_request.SaveRequest`) around the same tiny Llama and data as :mod:`runner.hf.tiny_training`,
every parameter trained. Under several ranks the model is sharded with FSDP2 (``fully_shard``, gloo on CPU): each
rank holds a slice of every weight and of its AdamW state, and writes that slice, ``__<rank>_0.distcp``, into
``checkpoint-<step>/``; rank 0 writes DCP's ``.metadata`` once every rank's write has reached it (DCP's own gather,
then a broadcast: a rank's save returns only after the whole checkpoint is written). Then each node's local rank 0
writes ``trainer_state.json`` (the step) and the ``.finetune-complete`` marker, so a node of a gang marks its own
part. Periodic saves go through ``dcp.async_save`` (the state copied aside, written by a thread on a process group of
its own, so its collectives never interleave with training's) while training goes on; a stop or a save request
first waits for a save in flight (marking it complete), then saves its own step with ``dcp.save`` and marks it.

Exact resume: the data order is a pure function of ``(seed, epoch)``, the learning rate of the step, no dropout,
one thread, deterministic algorithms; the checkpoint holds the weights and the whole optimizer state. A resumed run
ends with weights bitwise equal to an uninterrupted one with the same ranks. The final output (``model.safetensors``
and ``config.json`` in ``FINETUNE_OUTPUT_DIR``) is gathered to rank 0 and written by it alone.

Trainer processes only (it imports torch and transformers).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from safetensors.torch import save_file
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
from torch.distributed.checkpoint.planner import WriteItem
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import async_save as dcp_async_save
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save
from torch.distributed.fsdp import fully_shard
from transformers import LlamaForCausalLM

from runner.hf.tiny_training import BATCH_SIZE, FULL_WEIGHTS, TRAINER_STATE, PatternDataset, build_model
from runner.manifest import COMPLETE_MARKER
from runner.save_request import SaveRequest
from runner.stop_request import StopRequest, agree_max

DCP_METADATA = ".metadata"
"""The file DCP's coordinator (rank 0) writes last: what a loader reads first."""


@dataclass
class World:
    """This process's place: its rank, the ranks in all, whether it is its node's first, and the group DCP's
    background saves use (None: one process, no group)."""

    rank: int
    size: int
    local_zero: bool
    saves: Any = None


@dataclass
class SaveInFlight:
    step: int
    folder: str
    future: Future[Any]


def join(world_size: int) -> World:
    """Join the ranks' gloo group (several ranks), and make a second one for DCP's background saves."""
    local_zero = os.environ.get("LOCAL_RANK", "0") == "0"
    if world_size <= 1:
        return World(rank=0, size=1, local_zero=True)
    timeout = timedelta(seconds=float(os.environ.get("FINETUNE_COLLECTIVE_TIMEOUT_SECONDS") or 1800))
    dist.init_process_group("gloo", timeout=timeout)
    saves = dist.new_group(backend="gloo", timeout=timeout)
    return World(rank=dist.get_rank(), size=dist.get_world_size(), local_zero=local_zero, saves=saves)


def shard(model: LlamaForCausalLM, world: World) -> None:
    """FSDP2 over the ranks: each decoder layer a unit of its own, then the rest (embeddings, norm, head)."""
    if world.size <= 1:
        return
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)


def batch_for(step: int, world: World, seed: int, data: PatternDataset) -> dict[str, torch.Tensor]:
    """This rank's batch of the optimizer step after ``step``: the epoch's permutation is seeded by
    ``seed + epoch``, each step takes the next ``BATCH_SIZE × ranks`` sequences, each rank its slice."""
    per_step = BATCH_SIZE * world.size
    per_epoch = len(data) // per_step
    epoch, index = divmod(step, per_epoch)
    order = torch.randperm(len(data), generator=torch.Generator().manual_seed(seed + epoch))
    start = index * per_step + world.rank * BATCH_SIZE
    rows = data.input_ids[order[start : start + BATCH_SIZE]]
    return {"input_ids": rows, "labels": rows.clone()}


def state_of(model: LlamaForCausalLM, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """What a checkpoint holds: the model's and the optimizer's state, each rank its shard (DTensors)."""
    model_state, optimizer_state = get_state_dict(model, optimizer)
    return {"model": model_state, "optimizer": optimizer_state}


def restore(model: LlamaForCausalLM, optimizer: torch.optim.Optimizer, folder: str, world: World) -> int:
    """Every rank reads its shard of ``folder`` (a DCP checkpoint) into the model and the optimizer; the step."""
    state = state_of(model, optimizer)
    dcp_load(state, checkpoint_id=folder, no_dist=world.size <= 1)
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
    with open(os.path.join(folder, TRAINER_STATE), encoding="utf-8") as fh:
        return int(json.load(fh)["global_step"])


def mark_complete(folder: str, step: int, world: World) -> None:
    """Each node's local rank 0, once every rank's shard is written: the step, then the marker."""
    if not world.local_zero:
        return
    with open(os.path.join(folder, TRAINER_STATE), "w", encoding="utf-8") as fh:
        json.dump({"global_step": step}, fh)
    fd = os.open(os.path.join(folder, COMPLETE_MARKER), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class HeldPlanner(DefaultSavePlanner):
    """DCP's own planner, whose writes wait until ``release`` is set (``--hold-saves``): a background save then
    stays in flight, its folder begun, until the trainer waits for it."""

    def __init__(self, release: threading.Event) -> None:
        super().__init__()
        self.release = release

    def resolve_data(self, write_item: WriteItem) -> Any:
        self.release.wait()
        return super().resolve_data(write_item)


class Saver:
    """Checkpoints through DCP: in the background (periodic), or at once (a stop, a save request); one at a time.
    ``hold``: a background save finishes only when the trainer waits for it (a test knob: a notice then always
    finds a save in flight)."""

    def __init__(self, output_dir: str, world: World, last_step: int, hold: bool = False) -> None:
        self.output_dir = output_dir
        self.world = world
        self.in_flight: SaveInFlight | None = None
        self.last_step = last_step  # the newest step saved or being saved (the one resumed from, at first)
        self.hold = hold
        self.release = threading.Event()

    def folder(self, step: int) -> str:
        return os.path.join(self.output_dir, f"checkpoint-{step}")

    def start(self, state: dict[str, Any], step: int) -> None:
        """A periodic save: the state copied aside now, written by DCP's thread while training goes on."""
        self.settle()
        folder = self.folder(step)
        self.release.clear()
        planner = HeldPlanner(self.release) if self.hold else None
        future = dcp_async_save(
            state, checkpoint_id=folder, process_group=self.world.saves, no_dist=self.world.size <= 1, planner=planner
        )
        assert isinstance(future, Future)  # the default stager copies at once: a plain future, no staging one
        self.in_flight = SaveInFlight(step, folder, future)
        self.last_step = step

    def poll(self) -> None:
        """Mark the save in flight complete once it is written (this rank's save returned: every rank's did)."""
        if self.in_flight is not None and self.in_flight.future.done():
            self.settle()

    def settle(self) -> None:
        """Wait for the save in flight, and mark it complete."""
        if self.in_flight is None:
            return
        saving, self.in_flight = self.in_flight, None
        self.release.set()
        saving.future.result()
        mark_complete(saving.folder, saving.step, self.world)

    def now(self, state: dict[str, Any], step: int) -> None:
        """Save ``step`` at once, after the save in flight; marked complete when every rank's shard is written."""
        self.settle()
        folder = self.folder(step)
        dcp_save(state, checkpoint_id=folder, process_group=self.world.saves, no_dist=self.world.size <= 1)
        mark_complete(folder, step, self.world)
        self.last_step = step


def write_progress(step: int, total: int, loss: float, epoch: float, world: World) -> None:
    """One JSON line per step, on each node's local rank 0 (the runner's progress file)."""
    path = os.environ.get("FINETUNE_PROGRESS_FILE") or None
    if path is None or not world.local_zero:
        return
    line = {"step": step, "total_steps": total, "loss": loss, "epoch": epoch}
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(line) + "\n")


def save_final(model: LlamaForCausalLM, output_dir: str, world: World) -> None:
    """The whole model, gathered to rank 0 and written by it (a collective: every rank calls it)."""
    options = StateDictOptions(full_state_dict=world.size > 1, cpu_offload=world.size > 1)
    weights = get_model_state_dict(model, options=options)
    if world.rank == 0:
        tensors = {name: tensor.contiguous() for name, tensor in weights.items() if isinstance(tensor, torch.Tensor)}
        assert tensors.keys() == weights.keys()  # gathered in full: plain tensors, nothing else
        save_file(tensors, os.path.join(output_dir, FULL_WEIGHTS))
        model.config.save_pretrained(output_dir)


def train_sharded(args: argparse.Namespace, world_size: int) -> int:
    """One rank's run: train every parameter, save shards periodically and on a stop, write the final model."""
    stop = StopRequest()  # first: from here on a stop request is honoured
    save_request = SaveRequest()
    output_dir = os.environ.get("FINETUNE_OUTPUT_DIR", "")
    if not output_dir:
        print("runner.hf.tiny: FINETUNE_OUTPUT_DIR is not set (the directory to write checkpoints to)", file=sys.stderr)
        return 2
    resume_from = os.environ.get("FINETUNE_RESUME_FROM") or None
    if resume_from is not None and not os.path.isfile(os.path.join(resume_from, DCP_METADATA)):
        print(f"runner.hf.tiny: FINETUNE_RESUME_FROM={resume_from} is not a sharded (DCP) checkpoint", file=sys.stderr)
        return 2
    os.makedirs(output_dir, exist_ok=True)

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    world = join(world_size)
    model = build_model(args.seed, "full")
    assert isinstance(model, LlamaForCausalLM)
    shard(model, world)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0, foreach=False)
    step = restore(model, optimizer, resume_from, world) if resume_from is not None else 0
    data = PatternDataset()
    saver = Saver(output_dir, world, step, hold=args.hold_saves)
    per_epoch = len(data) // (BATCH_SIZE * world.size)
    stopped = False
    while step < args.max_steps:
        if args.step_seconds > 0:
            time.sleep(args.step_seconds)  # before the compute: a stop during the sleep ends this very step
        for group in optimizer.param_groups:  # linear decay to 0 over the run, a function of the step alone
            group["lr"] = args.lr * (args.max_steps - step) / args.max_steps
        loss = model(**batch_for(step, world, args.seed, data)).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        saver.poll()
        stopping, asked = agree_max([int(stop.requested), save_request.asked()])
        write_progress(step, args.max_steps, float(loss.item()), step / per_epoch, world)
        if stopping:
            stop.mark_stopped()
            saver.now(state_of(model, optimizer), step)
            stopped = True
            break
        if save_request.honour(asked):
            saver.now(state_of(model, optimizer), step)
        elif step % args.save_steps == 0:
            saver.start(state_of(model, optimizer), step)
    saver.settle()
    if not stopped and stop.agreed():  # notified after the last step: the final checkpoint is the job's state
        stop.mark_stopped()
        stopped = True
        if saver.last_step != step:  # the same on every rank
            saver.now(state_of(model, optimizer), step)
    if not stopped:
        save_final(model, output_dir, world)
    if world.rank == 0:
        print(json.dumps({"global_step": step, "interrupted": stopped}), flush=True)
    return 0

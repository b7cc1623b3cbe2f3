"""A tiny, real, CPU-only LoRA fine-tune that follows the runner's trainer contract (see ``runner.hf.callback``).

Run::

    FINETUNE_OUTPUT_DIR=/tmp/out python -m runner.hf.tiny [--max-steps 30] [--save-steps 5] [--lr 0.05]
        [--seed 0] [--step-seconds 0] [--save-seconds 0] [--processes 1] [--tuner lora|full] [--sharded false|true]

It is a stock HF ``Trainer`` around a 2-layer ``LlamaForCausalLM`` built from a ``LlamaConfig`` in code, wrapped
by peft LoRA (r=4 on q_proj/v_proj), trained on a synthetic data set generated in code: nothing is downloaded,
no tokenizer is involved, and 30 steps train in under a second on one CPU thread (the process takes ~3.5 s of CPU,
mostly importing torch, transformers and peft: :mod:`runner.hf.tiny_training`, which the torchrun launcher of
``--processes N`` does not import; :func:`load_training` keeps the garbage collector out of it, and the libraries
the run never uses, :data:`UNUSED_LIBRARIES`).
``--step-seconds`` stretches every step so a test or a demo can deliver a spot notice mid-training.
``--hang-after-step N`` makes the run hang after step N (alive, never exiting: asleep in ``_hang_forever`` inside the
next step), on its first ``--hangs`` runs only (counted in a file next to the stop file), so a test can watch the
runner's hang watchdog restart it and the restarted run finish.

``--tuner full`` trains every parameter of the model (no LoRA; the checkpoint holds the whole model and its AdamW
state). ``--sharded true`` (with ``--tuner full``) trains it sharded across the ranks (FSDP2) and saves each rank's
shard through ``torch.distributed.checkpoint``, periodic saves in the background: :mod:`runner.hf.tiny_sharded`.
``--hold-saves`` (sharded, a test knob) keeps a background save in flight until the run waits for it.

``--processes N`` (N > 1) makes this process torchrun (``torch.distributed.run`` with a standalone rendezvous on
a free port): it starts N ranks of this same module, which train the same model data-parallel (DDP on gloo, CPU;
4 sequences per rank and step) while it only supervises. The ranks watch the runner's stop file and agree on the
step (``runner.stop_request``); this process needs no signal.

On a node of a gang (the runner sets ``NNODES`` > 1, ``NODE_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``) it is torchrun
with a static multi-node rendezvous instead (``--nnodes --node-rank --master-addr --master-port``): every node's
ranks join one world. With one process per node this process is the node's rank itself (``RANK`` = ``NODE_RANK``,
``env://``), as torchrun would make it, without a launcher. ``FINETUNE_COLLECTIVE_TIMEOUT_SECONDS`` (set by the runner)
bounds every collective (``ddp_timeout``), so the ranks of a node whose peer was lost fail within it instead of
waiting 30 minutes.

Bitwise-reproducible resume
---------------------------
A run interrupted by a stop request and resumed (in a fresh process, from its last checkpoint) ends with LoRA weights
that are bitwise equal to those of an uninterrupted run with the same arguments. What makes that hold:

* The model state is fully restored. The checkpoint holds the LoRA weights (exact fp32 safetensors), the AdamW
  state, the LR scheduler, the RNG states and ``trainer_state.json`` (global step, epoch). The *frozen base*
  weights are not in the checkpoint (as with a real pre-trained model, which the resumed run loads again from
  the hub); here the base model plays that role by being a pure function of a constant seed
  (``BASE_MODEL_SEED``, independent of ``--seed``), initialised before anything else touches the RNG.
* The data order is a pure function of ``(data_seed, epoch)``. With ``use_seedable_sampler=True`` (accelerate's
  dataloader option, set here explicitly: the default differs between transformers releases, and ms-swift 4.6
  pins transformers < 5.20) the Trainer's ``RandomSampler`` becomes a
  ``SeedableRandomSampler`` that reseeds a private generator with ``data_seed + epoch`` at the start of each
  epoch; the Trainer calls ``set_epoch`` before every epoch, including the one it resumes into, and skips the
  batches already consumed in that epoch (``skip_first_batches``). ``data_seed=seed`` is passed explicitly:
  without it the sampler uses ``torch.initial_seed()``, i.e. whatever the global RNG was last seeded with when
  the dataloader was built, which happens to be ``seed`` here but depends on what else the script seeds.
  The plain ``RandomSampler`` (``use_seedable_sampler=False``) is *not* resumable bitwise: it draws each
  epoch's permutation seed from the global RNG when the epoch's iterator is created, and on resume that
  happens before the checkpoint's RNG state is restored, so a run resumed in epoch >= 1 replays epoch 0's
  order (observed: interrupted at step 18, the resumed adapter differs; within epoch 0 it happened to match).
* Nothing else draws random numbers during training: every dropout (attention, LoRA) is 0.
* Under torchrun each rank also saves and restores its own RNG state (``rng_state_<rank>.pth``), the sampler
  splits the same seeded permutation between the ranks, and gloo's all-reduce of two ranks' gradients gives
  both the same sum, so a resumed two-rank run is bitwise equal to an uninterrupted two-rank run.
* The arithmetic is deterministic: one intra-op thread (``torch.set_num_threads(1)``; CPU reductions then run in
  a fixed order), ``full_determinism=True`` (``torch.use_deterministic_algorithms``), eager attention, fp32,
  the plain (non-fused) AdamW, no gradient accumulation and no data-loader workers.

An interrupted run saves a checkpoint at the step it was at (not necessarily a multiple of ``--save-steps``) and
does *not* write the final adapter. The final adapter is written exactly once, by the run that finishes, with
``trainer.save_model(output_dir)`` into ``FINETUNE_OUTPUT_DIR`` itself.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m runner.hf.tiny",
        description="Tiny CPU LoRA fine-tune following the runner's trainer contract (FINETUNE_* env vars).",
    )
    parser.add_argument("--max-steps", type=int, default=30, help="optimizer steps in total (default 30)")
    parser.add_argument("--save-steps", type=int, default=5, help="checkpoint every K steps (default 5)")
    parser.add_argument("--lr", type=float, default=5e-2, help="peak learning rate, linear decay (default 0.05)")
    parser.add_argument("--seed", type=int, default=0, help="seed for LoRA init and data order (default 0)")
    parser.add_argument(
        "--step-seconds", type=float, default=0.0, help="make every step last at least this long (default 0)"
    )
    parser.add_argument(
        "--save-seconds", type=float, default=0.0, help="make every checkpoint take this much longer (default 0)"
    )
    parser.add_argument(
        "--processes", type=int, default=1, help="data-parallel ranks, started with torchrun on gloo (default 1)"
    )
    parser.add_argument(
        "--hang-after-step", type=int, default=0, help="hang (alive, no exit) after this step; 0: never (default)"
    )
    parser.add_argument("--hangs", type=int, default=1, help="how many runs of this work dir hang (default 1)")
    parser.add_argument(
        "--tuner", choices=("lora", "full"), default="lora", help="train a LoRA adapter, or every parameter"
    )
    parser.add_argument(
        "--sharded",
        choices=("true", "false"),
        default="false",
        help="every rank saves its own shard through torch.distributed.checkpoint (needs --tuner full)",
    )
    parser.add_argument(
        "--hold-saves",
        action="store_true",
        help="a background save finishes only when the run waits for it (sharded; a test knob)",
    )
    args = parser.parse_args(argv)
    if args.max_steps < 1:
        parser.error("--max-steps must be >= 1")
    if args.save_steps < 1:
        parser.error("--save-steps must be >= 1")
    if args.step_seconds < 0:
        parser.error("--step-seconds must be >= 0")
    if args.save_seconds < 0:
        parser.error("--save-seconds must be >= 0")
    if args.processes < 1:
        parser.error("--processes must be >= 1")
    if args.hang_after_step < 0:
        parser.error("--hang-after-step must be >= 0")
    if args.hangs < 0:
        parser.error("--hangs must be >= 0")
    args.sharded = args.sharded == "true"
    if args.sharded and args.tuner != "full":
        parser.error("--sharded true needs --tuner full")
    if args.sharded and (args.hang_after_step or args.save_seconds):
        parser.error("--sharded true takes neither --hang-after-step nor --save-seconds")
    if args.hold_saves and not args.sharded:
        parser.error("--hold-saves needs --sharded true")
    return args


def rendezvous_args(environ: dict[str, str] | os._Environ[str]) -> list[str]:
    """torchrun's rendezvous: the gang's static world when ``NNODES`` > 1, else a standalone one on this node."""
    nodes = int(environ.get("NNODES", "1") or "1")
    if nodes <= 1:
        return ["--standalone"]
    return [
        "--nnodes",
        str(nodes),
        "--node-rank",
        environ["NODE_RANK"],
        "--master-addr",
        environ["MASTER_ADDR"],
        "--master-port",
        environ["MASTER_PORT"],
    ]


@contextmanager
def collector_paused() -> Iterator[None]:
    """Import torch, transformers and peft with the cyclic garbage collector off, then freeze what they made.

    The imports allocate millions of objects and free almost none, so the collector's passes over them during
    the import, and its last pass at the interpreter's exit, find nothing. Frozen (``gc.freeze``), those objects
    are left out of every later collection, that last one included: a start costs ~3.5 s of CPU instead of 5.5
    (the same run, bitwise the same adapter).
    """
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.enable()


UNUSED_LIBRARIES = ("datasets", "scipy")
"""Installed beside the trainer (ms-swift needs them) and never used by the tiny run, which trains on a torch
``Dataset`` made in code: transformers' ``Trainer`` imports ``datasets`` (pandas and pyarrow with it) whenever it is
installed, and its object-detection losses import ``scipy.optimize``. About 1 s of CPU of every start."""


def load_training(sharded: bool = False) -> tuple[Callable[[], None], Callable[[argparse.Namespace, int], int]]:
    """Import the training (torch, transformers and peft: :mod:`runner.hf.tiny_training`, and
    :mod:`runner.hf.tiny_sharded` for ``sharded``) as cheaply as it can be:
    :data:`UNUSED_LIBRARIES` marked absent first (``None`` in ``sys.modules``, Python's own way of saying a module is
    not there: transformers' ``importlib.util.find_spec`` then finds nothing, and skips them), the collector paused.
    Its ``(leave_process_group, train)``."""
    for name in UNUSED_LIBRARIES:
        sys.modules.setdefault(name, None)  # type: ignore[arg-type]
    with collector_paused():
        from runner.hf.tiny_training import leave_process_group, train

        if sharded:
            from runner.hf.tiny_sharded import train_sharded

            return leave_process_group, train_sharded
    return leave_process_group, train


def launch_ranks(nproc: int, argv: Sequence[str]) -> int:
    """Be torchrun: start ``nproc`` ranks of this same module (each sees ``LOCAL_RANK`` and trains) and wait.

    This process then only supervises, as ``torchrun`` itself would: the ranks watch the runner's stop file.
    """
    with collector_paused():
        from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
        from torch.distributed.run import main as torchrun

    # torchrun's per-rank error files go to a folder of its own that it never removes (one per launch, in /tmp):
    # this launch's is removed when it ends, its ranks' failures already told.
    with tempfile.TemporaryDirectory(prefix="torchelastic_") as logs:
        launch = [*rendezvous_args(os.environ), "--nproc_per_node", str(nproc), "--log-dir", logs]
        try:
            torchrun([*launch, "-m", "runner.hf.tiny", *argv])
        except ChildFailedError as exc:
            print(f"runner.hf.tiny: a rank failed: {exc}", file=sys.stderr)
            return 1
    return 0


def join_world_alone(nodes: int) -> int:
    """One process per node: this process is the node's rank, in the static world ``MASTER_ADDR``/``MASTER_PORT``
    names (``env://``, what torchrun would set up for it, without a launcher's process and its exit barrier)."""
    os.environ.update(
        RANK=os.environ["NODE_RANK"],
        WORLD_SIZE=str(nodes),
        LOCAL_RANK="0",
        LOCAL_WORLD_SIZE="1",
        GROUP_RANK=os.environ["NODE_RANK"],
    )
    return nodes


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    nodes = int(os.environ.get("NNODES", "1") or "1")
    if "LOCAL_RANK" not in os.environ:
        if args.processes > 1:
            return launch_ranks(args.processes, sys.argv[1:] if argv is None else argv)
        if nodes > 1:  # one rank on this node: it is the node's only process, no launcher needed
            world_size = join_world_alone(nodes)
    # Only a process that trains loads torch, transformers and peft (3 s of CPU): the launcher above needs none.
    leave_process_group, train = load_training(args.sharded)
    from runner.hf.tiny_training import EXIT_WORLD_BROKE  # loaded by now: no cost

    code = train(args, world_size)
    if code == EXIT_WORLD_BROKE:  # the group cannot be left (its peers are gone): out at once, the save is done
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    leave_process_group()  # only after a clean run: a rank that raised leaves the cleanup to torchrun
    return code


if __name__ == "__main__":
    sys.exit(main())

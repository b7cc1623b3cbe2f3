"""A tiny, real, CPU-only LoRA fine-tune that follows the runner's trainer contract (see ``runner.hf.callback``).

Run::

    FINETUNE_OUTPUT_DIR=/tmp/out python -m runner.hf.tiny [--max-steps 30] [--save-steps 5] [--lr 0.05]
        [--seed 0] [--step-seconds 0] [--save-seconds 0] [--processes 1]

It is a stock HF ``Trainer`` around a 2-layer ``LlamaForCausalLM`` built from a ``LlamaConfig`` in code, wrapped
by peft LoRA (r=4 on q_proj/v_proj), trained on a synthetic data set generated in code: nothing is downloaded,
no tokenizer is involved, and 30 steps train in under a second on one CPU thread (the process takes ~10 s,
mostly importing torch, transformers and peft). ``--step-seconds`` stretches every step so a test or a demo can
deliver a spot notice mid-training.

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
import json
import os
import sys
import time
import warnings
from collections.abc import Sequence
from typing import Any

import torch
from peft import LoraConfig, PeftModel, get_peft_model, get_peft_model_state_dict, set_peft_model_state_dict
from safetensors.torch import load_file
from torch.utils.data import Dataset
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    Trainer,
    TrainerCallback,
    TrainerControl,
    TrainerState,
    TrainingArguments,
    set_seed,
)

from runner.hf.callback import SpotCheckpointCallback

BASE_MODEL_SEED = 1234
"""Seed of the frozen random "pre-trained" base model: fixed, so every run trains on the very same base."""

NUM_SEQUENCES = 64
SEQ_LEN = 32
VOCAB_SIZE = 128
BATCH_SIZE = 4
TRAINER_STATE = "trainer_state.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"


class PatternDataset(Dataset[dict[str, torch.Tensor]]):
    """Deterministic synthetic causal-LM data: arithmetic progressions modulo the vocabulary.

    Sequence ``i`` starts at token ``(7 * i) % V`` and advances by ``1 + i % 5``: after two tokens the rest is
    predictable, so the loss visibly falls within a few dozen steps.
    """

    def __init__(self, num_sequences: int = NUM_SEQUENCES, seq_len: int = SEQ_LEN, vocab: int = VOCAB_SIZE) -> None:
        positions = torch.arange(seq_len)
        rows = [((7 * i) % vocab + (1 + i % 5) * positions) % vocab for i in range(num_sequences)]
        self.input_ids = torch.stack(rows).to(torch.long)

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        ids = self.input_ids[index]
        return {"input_ids": ids, "labels": ids.clone()}


class StepDelayCallback(TrainerCallback):
    """Make every optimizer step last at least ``seconds`` (sleeps at step begin, before the compute).

    Sleeping before the step means a stop request made during the sleep is acted on at the end of that same step.
    """

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds

    def on_step_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> TrainerControl:
        if self.seconds > 0:
            time.sleep(self.seconds)
        return control


def build_model(seed: int) -> PeftModel:
    """The tiny Llama base (seeded by ``BASE_MODEL_SEED``) wrapped with a LoRA adapter (seeded by ``seed``)."""
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=64,
        # A wider init than the usual 0.02 gives the frozen random base logits of a useful scale, so a rank-4
        # LoRA on q/v alone visibly lowers the loss within 30 steps.
        initializer_range=0.2,
        attention_dropout=0.0,
        mlp_bias=False,
        attention_bias=False,
        tie_word_embeddings=False,
        use_cache=False,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    config._attn_implementation = "eager"
    set_seed(BASE_MODEL_SEED)
    base = LlamaForCausalLM(config)  # type: ignore[no-untyped-call,unused-ignore]  # untyped in transformers 5.19
    set_seed(seed)
    lora = LoraConfig(
        r=4,
        lora_alpha=8,
        lora_dropout=0.0,
        target_modules=["q_proj", "v_proj"],
        bias="none",
        task_type="CAUSAL_LM",
    )
    model = get_peft_model(base, lora)
    assert isinstance(model, PeftModel)
    return model


def _checkpoint_step(checkpoint: str) -> int:
    """The global step a Trainer checkpoint was saved at (from its ``trainer_state.json``)."""
    with open(os.path.join(checkpoint, TRAINER_STATE), encoding="utf-8") as fh:
        return int(json.load(fh)["global_step"])


class SaveDelayCallback(TrainerCallback):
    """Make every checkpoint take at least ``seconds`` longer to complete (sleeps after the files are written and
    before the completion marker), like a large checkpoint copied off the GPU: a notice can land mid-save."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds

    def on_save(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> TrainerControl:
        if self.seconds > 0:
            time.sleep(self.seconds)
        return control


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


def launch_ranks(nproc: int, argv: Sequence[str]) -> int:
    """Be torchrun: start ``nproc`` ranks of this same module (each sees ``LOCAL_RANK`` and trains) and wait.

    This process then only supervises, as ``torchrun`` itself would: the ranks watch the runner's stop file.
    """
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun

    try:
        torchrun([*rendezvous_args(os.environ), "--nproc_per_node", str(nproc), "-m", "runner.hf.tiny", *argv])
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
    code = train(args, world_size)
    leave_process_group()  # only after a clean run: a rank that raised leaves the cleanup to torchrun
    return code


def leave_process_group() -> None:
    """Under torchrun: wait for every rank, then tear gloo down before the interpreter exits.

    A rank that exits with the group still up aborts (``terminate called without an active exception``: gloo's
    threads are still joinable when the interpreter's destructors run), and torchrun then calls the job failed.
    """
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def train(args: argparse.Namespace, world_size: int) -> int:
    """One process's training run (the only one, or one rank): checkpoints, resume, the final adapter."""
    # First, before the slow parts: from here on a stop request means "checkpoint at the next step and stop".
    spot = SpotCheckpointCallback()

    output_dir = os.environ.get("FINETUNE_OUTPUT_DIR", "")
    if not output_dir:
        print(
            "runner.hf.tiny: FINETUNE_OUTPUT_DIR is not set (the directory to write checkpoints to)",
            file=sys.stderr,
        )
        return 2
    resume_from = os.environ.get("FINETUNE_RESUME_FROM") or None
    if resume_from is not None and not os.path.isfile(os.path.join(resume_from, TRAINER_STATE)):
        print(f"runner.hf.tiny: FINETUNE_RESUME_FROM={resume_from} is not a Trainer checkpoint", file=sys.stderr)
        return 2
    os.makedirs(output_dir, exist_ok=True)

    torch.set_num_threads(1)
    # peft 0.21 probes the attribute transformers 5 renamed to is_activation_checkpointing: harmless noise.
    warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
    model = build_model(args.seed)
    training_args = TrainingArguments(
        output_dir=output_dir,
        max_steps=args.max_steps,
        per_device_train_batch_size=BATCH_SIZE,
        gradient_accumulation_steps=1,
        learning_rate=args.lr,
        lr_scheduler_type="linear",
        warmup_steps=0,
        weight_decay=0.0,
        optim="adamw_torch",
        save_strategy="steps",
        save_steps=args.save_steps,
        logging_strategy="steps",
        logging_steps=1,
        report_to="none",
        use_cpu=True,
        seed=args.seed,
        data_seed=args.seed,
        full_determinism=True,
        dataloader_num_workers=0,
        remove_unused_columns=False,
        disable_tqdm=True,
        accelerator_config={"use_seedable_sampler": True},  # data order = f(data_seed, epoch): see above
        # Under torchrun: plain DDP on gloo (CPU), every LoRA weight gets a gradient on every step.
        ddp_backend="gloo" if world_size > 1 else None,
        ddp_find_unused_parameters=False if world_size > 1 else None,
        ddp_timeout=int(float(os.environ.get("FINETUNE_COLLECTIVE_TIMEOUT_SECONDS") or 1800)),
    )
    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=PatternDataset(),
        # The save delay runs before the spot callback's on_save, which marks the checkpoint complete.
        callbacks=[SaveDelayCallback(args.save_seconds), spot, StepDelayCallback(args.step_seconds)],
    )
    done = _checkpoint_step(resume_from) if resume_from is not None else 0
    if resume_from is not None and done >= args.max_steps:
        # Nothing left to train (e.g. the notice came after the last step, so that run saved its final
        # checkpoint but not the final output). Don't call train(): resuming from a checkpoint at max_steps
        # runs one *extra* optimizer step unless max_steps is a multiple of the steps per epoch.
        weights = load_file(os.path.join(resume_from, ADAPTER_WEIGHTS))
        set_peft_model_state_dict(model, weights)
        loaded = get_peft_model_state_dict(model)
        if loaded.keys() != weights.keys() or not all(torch.equal(loaded[k], weights[k]) for k in weights):
            raise RuntimeError(f"{resume_from}: its adapter does not match this model")
        stopped = spot.stopped()
        if not stopped:
            trainer.save_model(output_dir)
        _say({"global_step": done, "interrupted": stopped})
        return 0
    result = trainer.train(resume_from_checkpoint=resume_from)
    stopped = spot.stopped()  # the same answer on every rank
    summary = {"global_step": result.global_step, "interrupted": stopped}
    if stopped:
        # Interrupted (or notified after the last step): the checkpoint of this step is saved and marked
        # complete; the run that resumes from it writes the final output.
        _say(summary)
        return 0
    trainer.save_model(output_dir)
    _say(summary)
    return 0


def _say(summary: dict[str, Any]) -> None:
    """The run's one-line JSON summary, printed once (by rank 0 under torchrun)."""
    if os.environ.get("RANK", "0") == "0":
        print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    sys.exit(main())

"""The tiny run's training: the model, the data and the ``Trainer`` of ``python -m runner.hf.tiny``.

Kept apart from :mod:`runner.hf.tiny` (the command line and the torchrun launcher) because it imports torch,
transformers and peft (about 3 s of CPU; 5 s with the garbage collector on, see ``runner.hf.tiny.collector_paused``),
which the launcher of ``--processes N`` does not need: it only supervises its ranks. Why a resumed run is bitwise
equal to an uninterrupted one is told in :mod:`runner.hf.tiny`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings
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
from runner.hf.held_state import StepSeedCallback, save_held, world_broke

BASE_MODEL_SEED = 1234
"""Seed of the frozen random "pre-trained" base model: fixed, so every run trains on the very same base."""

NUM_SEQUENCES = 64
SEQ_LEN = 32
VOCAB_SIZE = 128
BATCH_SIZE = 4
TRAINER_STATE = "trainer_state.json"
EXIT_WORLD_BROKE = 75
"""A peer was lost: this rank saved the step it holds (``runner.hf.held_state``) and leaves without the group."""
ADAPTER_WEIGHTS = "adapter_model.safetensors"
FULL_WEIGHTS = "model.safetensors"
"""The whole model's weights, as ``save_pretrained`` names them (``--tuner full``)."""


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


HANGS_SUFFIX = ".tiny-hangs"
"""Appended to the stop file's path: one line per run of the work dir that hung (``--hang-after-step``)."""


def _hang_forever() -> None:
    """Never return, never exit: what a rank stuck in a collective or a driver call looks like from outside."""
    while True:
        time.sleep(3600)


class HangCallback(TrainerCallback):
    """Hang at the start of the step after ``after_step`` (a test knob), on the first ``hangs`` runs of the work dir
    only, so the run the runner restarts trains on."""

    def __init__(self, after_step: int, hangs: int) -> None:
        super().__init__()
        self.after_step = after_step
        self.hangs = hangs
        stop_file = os.environ.get("FINETUNE_STOP_FILE") or os.path.join(os.environ["FINETUNE_OUTPUT_DIR"], "stop")
        self.record = stop_file + HANGS_SUFFIX

    def on_step_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> TrainerControl:
        if self.after_step and state.global_step == self.after_step and self._hung_before() < self.hangs:
            with open(self.record, "a", encoding="utf-8") as record:
                record.write(f"{os.getpid()}\n")
            _hang_forever()
        return control

    def _hung_before(self) -> int:
        try:
            with open(self.record, encoding="utf-8") as record:
                return len(record.read().splitlines())
        except FileNotFoundError:
            return 0


def build_base() -> LlamaForCausalLM:
    """The tiny Llama "pre-trained" base, a pure function of ``BASE_MODEL_SEED`` (the RNG left seeded by it)."""
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
    return LlamaForCausalLM(config)  # type: ignore[no-untyped-call,unused-ignore]  # untyped in transformers 5.19


def build_model(seed: int, tuner: str = "lora") -> PeftModel | LlamaForCausalLM:
    """The tiny base wrapped with a LoRA adapter (seeded by ``seed``), or the base itself, every parameter trained
    (``tuner`` ``full``)."""
    base = build_base()
    set_seed(seed)
    if tuner == "full":
        return base
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
    model = build_model(args.seed, args.tuner)
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
        callbacks=[
            SaveDelayCallback(args.save_seconds),
            spot,
            StepDelayCallback(args.step_seconds),
            HangCallback(args.hang_after_step, args.hangs),
            StepSeedCallback(args.seed),  # every rank's RNG a function of (seed, step, rank): rebuilt by rule
        ],
    )
    done = _checkpoint_step(resume_from) if resume_from is not None else 0
    if resume_from is not None and done >= args.max_steps:
        # Nothing left to train (e.g. the notice came after the last step, so that run saved its final
        # checkpoint but not the final output). Don't call train(): resuming from a checkpoint at max_steps
        # runs one *extra* optimizer step unless max_steps is a multiple of the steps per epoch.
        _load_weights(model, resume_from)
        stopped = spot.stopped()
        if not stopped:
            trainer.save_model(output_dir)
        _say({"global_step": done, "interrupted": stopped})
        return 0
    try:
        result = trainer.train(resume_from_checkpoint=resume_from)
    except Exception as exc:
        if not world_broke(exc):
            raise
        # A peer is gone: every rank holds the same step (data-parallel), so the survivors keep it.
        print(f"runner.hf.tiny: the world broke ({exc}); saving the step this rank holds", file=sys.stderr)
        save_held(trainer, args.seed)
        return EXIT_WORLD_BROKE
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


def _load_weights(model: PeftModel | LlamaForCausalLM, checkpoint: str) -> None:
    """The trained weights of a checkpoint into ``model``: its adapter (LoRA) or the whole model (full)."""
    if isinstance(model, PeftModel):
        weights = load_file(os.path.join(checkpoint, ADAPTER_WEIGHTS))
        set_peft_model_state_dict(model, weights)
        loaded = get_peft_model_state_dict(model)
    else:
        weights = load_file(os.path.join(checkpoint, FULL_WEIGHTS))
        model.load_state_dict(weights)
        loaded = model.state_dict()
    if loaded.keys() != weights.keys() or not all(torch.equal(loaded[k], weights[k]) for k in weights):
        raise RuntimeError(f"{checkpoint}: its weights do not match this model")


def _say(summary: dict[str, Any]) -> None:
    """The run's one-line JSON summary, printed once (by rank 0 under torchrun)."""
    if os.environ.get("RANK", "0") == "0":
        print(json.dumps(summary), flush=True)

"""A plain Hugging Face ``Trainer`` script, as a team writes one: no callback of ours, no progress file, its own
save on SIGTERM (``--enable_jit_checkpoint``). Everything it trains is built in code (a tiny Llama, a pattern
data set); nothing is downloaded.

    python tests/trainers/plain_hf_trainer.py --output_dir DIR --save_steps 10 --max_steps 40 \\
        --enable_jit_checkpoint [--resume_from_checkpoint CKPT]

``STEP_SLEEP`` (seconds, in its environment) slows each batch down, so that a test can land a notice between saves.
"""

from __future__ import annotations

import os
import time

import torch
from torch.utils.data import Dataset
from transformers import HfArgumentParser, LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments, set_seed

VOCAB = 64
SEQ_LEN = 16


class Patterns(Dataset[dict[str, torch.Tensor]]):
    def __init__(self, rows: int = 64) -> None:
        positions = torch.arange(SEQ_LEN)
        self.ids = torch.stack([((3 * i) % VOCAB + (1 + i % 4) * positions) % VOCAB for i in range(rows)])
        self.sleep = float(os.environ.get("STEP_SLEEP", "0"))

    def __len__(self) -> int:
        return int(self.ids.shape[0])

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        time.sleep(self.sleep)
        return {"input_ids": self.ids[index], "labels": self.ids[index].clone()}


def main() -> None:
    (args,) = HfArgumentParser(TrainingArguments).parse_args_into_dataclasses()
    set_seed(args.seed)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=SEQ_LEN,
    )
    model = LlamaForCausalLM(config)
    trainer = Trainer(model=model, args=args, train_dataset=Patterns())
    trainer.train(resume_from_checkpoint=args.resume_from_checkpoint)
    trainer.save_model(args.output_dir)


if __name__ == "__main__":
    main()

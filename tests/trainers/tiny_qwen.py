"""A tiny Qwen2 chat model and a chat data set, built in code: what ms-swift needs to run a real ``swift sft``.

    python -m tests.trainers.tiny_qwen DIR    # DIR/DeepSeek-R1-Distill-Qwen-7B/ and DIR/chat.jsonl

The model directory is named like the guide's model, so ms-swift infers what it infers for the real one (model
type ``qwen2``, template ``deepseek_r1``) from the name and ``config.json``; its tokenizer is a byte-level BPE
trained here on the data set's words, with the template's special tokens. Nothing is downloaded.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

MODEL_NAME = "DeepSeek-R1-Distill-Qwen-7B"
DATA_NAME = "chat.jsonl"
ROWS = 48
WORDS = [
    *("alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa"),
    *("lambda", "mu", "nu", "xi", "omicron", "pi", "rho", "sigma", "tau", "upsilon"),
]
# The deepseek_r1 template's tokens, then padding.
SPECIAL = [
    "<｜begin▁of▁sentence｜>",
    "<｜end▁of▁sentence｜>",
    "<｜User｜>",
    "<｜Assistant｜>",
    "<think>",
    "</think>",
    "<｜▁pad▁｜>",
]


def build(root: Path) -> tuple[Path, Path]:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    model_dir = root / MODEL_NAME
    model_dir.mkdir(parents=True, exist_ok=True)
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator([" ".join(WORDS)] * 4, trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe, bos_token=SPECIAL[0], eos_token=SPECIAL[1], pad_token=SPECIAL[-1]
    )
    tokenizer.save_pretrained(model_dir)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).save_pretrained(model_dir)

    data = root / DATA_NAME
    with data.open("w", encoding="utf-8") as fh:
        for i in range(ROWS):
            question = " ".join(WORDS[(i + k) % len(WORDS)] for k in range(3))
            answer = " ".join(WORDS[(3 * i + k) % len(WORDS)] for k in range(5))
            messages = [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
            fh.write(json.dumps({"messages": messages}) + "\n")
    return model_dir, data


if __name__ == "__main__":
    model, data = build(Path(sys.argv[1]))
    print(json.dumps({"model": str(model), "data": str(data)}))

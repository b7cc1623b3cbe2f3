"""What a completed job's ``output/`` holds: what the trainer wrote outside its checkpoints, and always its model.

An HF Trainer script ends with ``save_model(output_dir)``, so the weights sit next to the checkpoints. ms-swift
writes no final model of its own: its last save is the last ``checkpoint-<N>/`` (``logging.jsonl`` names it as
``last_model_checkpoint``). So when nothing outside the checkpoints holds weights, the newest complete checkpoint
goes into the output too, under its own name (``output/checkpoint-<N>/``, swift's layout, which its ``infer`` and
``export`` take as they are), without what only a resume needs: optimizer, scheduler and RNG states stay in the
committed checkpoint.

The output directory is the trainer's, and the runner that uploads it may be root: it is listed without following
a link (``runner.beneath``), and each file is opened for its upload component by component, again without
following one (:func:`runner.beneath.pinned`), so no link or swapped directory makes the runner upload a file of
its own.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path, PurePosixPath

from runner.beneath import regular_files
from runner.local_checkpoints import checkpoint_step, newest_complete
from runner.manifest import COMPLETE_MARKER

_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
_RESUME_ONLY = re.compile(r"^(optimizer.*|scheduler\.pt|scaler\.pt|rng_state.*\.pth|global_step\d+)$")
_NOT_WEIGHTS = frozenset({"training_args.bin"})


def output_files(output_dir: Path) -> list[tuple[Path, str]]:
    """Every file to upload as the output: ``(local path, path under output/)``."""
    found = [(path, path.relative_to(output_dir).as_posix()) for path in _files(output_dir, top_level=_own_file)]
    if not any(_is_weights(path) for path, _ in found):
        last = newest_complete(output_dir, trainer_exited_cleanly=True)
        if last is not None:
            found += [
                (path, f"{last.path.name}/{path.relative_to(last.path).as_posix()}")
                for path in _files(last.path, top_level=lambda name: not _RESUME_ONLY.fullmatch(name))
            ]
    return found


def _own_file(name: str) -> bool:
    """Top-level names of the trainer's own output (not a checkpoint, not the runner's hidden bookkeeping)."""
    return checkpoint_step(name) is None and not name.startswith(".")


def _is_weights(path: Path) -> bool:
    return path.suffix in _WEIGHT_SUFFIXES and path.name not in _NOT_WEIGHTS and not _RESUME_ONLY.fullmatch(path.name)


def _files(root: Path, top_level: Callable[[str], bool]) -> list[Path]:
    """Regular files under ``root`` whose first path part passes ``top_level``; links are neither followed nor
    listed (swift's ``last-checkpoint`` link points back into a checkpoint) and our marker is left out."""
    found = []
    for relative in regular_files(root):
        first, _, _ = relative.partition("/")
        if top_level(first) and PurePosixPath(relative).name != COMPLETE_MARKER:
            found.append(root / relative)
    return sorted(found)

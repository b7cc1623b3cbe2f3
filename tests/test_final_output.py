"""What a completed job's output holds (``runner.final_output``): the trainer's own files, and always its model."""

from __future__ import annotations

from pathlib import Path

from runner.final_output import output_files


def write(path: Path, data: bytes = b"x") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def keys(output: Path) -> set[str]:
    return {key for _, key in output_files(output)}


def checkpoint(output: Path, step: int, complete: bool = True) -> Path:
    ckpt = output / f"checkpoint-{step}"
    for name in ("adapter_model.safetensors", "adapter_config.json", "args.json", "trainer_state.json"):
        write(ckpt / name)
    for name in ("optimizer.pt", "scheduler.pt", "rng_state.pth", "rng_state_1.pth", "scaler.pt"):
        write(ckpt / name)
    write(ckpt / "global_step40" / "mp_rank_00_model_states.pt")
    if complete:
        write(ckpt / ".finetune-complete", b"")
    return ckpt


def test_an_hf_trainer_output_is_its_own_files_and_no_checkpoint(tmp_path: Path) -> None:
    checkpoint(tmp_path, 20)
    write(tmp_path / "adapter_model.safetensors")
    write(tmp_path / "training_args.bin")
    write(tmp_path / "runs" / "events.out")
    write(tmp_path / ".restore-x" / "junk")
    assert keys(tmp_path) == {"adapter_model.safetensors", "training_args.bin", "runs/events.out"}


def test_swifts_last_checkpoint_is_the_model_and_goes_into_the_output_without_resume_state(tmp_path: Path) -> None:
    checkpoint(tmp_path, 30)
    last = checkpoint(tmp_path, 40)
    write(tmp_path / "logging.jsonl")
    write(tmp_path / "args.json")
    write(tmp_path / "training_args.bin")  # not weights
    (tmp_path / "last-checkpoint").symlink_to(last, target_is_directory=True)  # swift's link: not followed
    assert keys(tmp_path) == {
        "logging.jsonl",
        "args.json",
        "training_args.bin",
        "checkpoint-40/adapter_model.safetensors",
        "checkpoint-40/adapter_config.json",
        "checkpoint-40/args.json",
        "checkpoint-40/trainer_state.json",
    }
    local = dict((key, path) for path, key in output_files(tmp_path))
    assert local["checkpoint-40/adapter_model.safetensors"] == last / "adapter_model.safetensors"


def test_on_completion_the_newest_checkpoint_is_the_model_marker_or_not(tmp_path: Path) -> None:
    # A trainer that exited 0 has finished every checkpoint it started, marker or not.
    checkpoint(tmp_path, 10)
    checkpoint(tmp_path, 20, complete=False)
    assert "checkpoint-20/adapter_model.safetensors" in keys(tmp_path)
    assert not any(key.startswith("checkpoint-10/") for key in keys(tmp_path))


def test_nothing_at_all_is_an_empty_output(tmp_path: Path) -> None:
    assert output_files(tmp_path) == []

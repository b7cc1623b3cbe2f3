"""What the root runner reads or hands over below the trainer's directory, it reaches without following a link.

Real files, links, FIFOs and hard links in a temporary directory; the ownership tests change owners for real, so
they need root (as the runner that hands ``output/`` over is).
"""

from __future__ import annotations

import errno
import os
import pwd
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from runner import beneath
from runner.final_output import output_files
from runner.manifest import COMPLETE_MARKER, checkpoint_files
from runner.trainer_user import TrainerUser

pytestmark = pytest.mark.unit


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A directory of root's the trainer must never get: a secret in it, a directory below it."""
    place = tmp_path / "root-only"
    (place / "inner").mkdir(parents=True)
    (place / "secret").write_text("the runner's")
    (place / "inner" / "deeper").write_text("also the runner's")
    return place


def owners(place: Path) -> dict[str, int]:
    found = {".": place.lstat().st_uid}
    for dirpath, dirs, files in os.walk(place):
        for name in [*dirs, *files]:
            full = Path(dirpath) / name
            found[str(full.relative_to(place))] = full.lstat().st_uid
    return found


@pytest.fixture
def nobody() -> TrainerUser:
    if os.geteuid() != 0:
        pytest.skip("changing owners needs root, as the runner that hands output/ over is")
    entry = pwd.getpwnam("nobody")
    return TrainerUser(name="nobody", uid=entry.pw_uid, gid=entry.pw_gid, groups=())


def test_a_link_at_any_component_fails_the_open(tmp_path: Path, outside: Path) -> None:
    output = tmp_path / "output"
    (output / "checkpoint-5").mkdir(parents=True)
    (output / "checkpoint-5" / "model.bin").write_bytes(b"weights")
    (output / "swapped").symlink_to(outside, target_is_directory=True)
    (output / "leak").symlink_to(outside / "secret")

    fd = beneath.open_file_beneath(output, output / "checkpoint-5" / "model.bin")
    with os.fdopen(fd, "rb") as file:
        assert file.read() == b"weights"
    with pytest.raises(OSError) as middle:  # a directory on the way swapped for a link: not followed
        beneath.open_file_beneath(output, output / "swapped" / "secret")
    assert middle.value.errno in (errno.ELOOP, errno.ENOTDIR)
    with pytest.raises(OSError) as last:
        beneath.open_file_beneath(output, output / "leak")
    assert last.value.errno == errno.ELOOP
    moved = tmp_path / "moved-output"
    output.rename(moved)
    output.symlink_to(moved, target_is_directory=True)  # the trainer owns output/ itself, and may swap it too
    with pytest.raises(OSError) as top:
        beneath.open_file_beneath(output, output / "checkpoint-5" / "model.bin")
    assert top.value.errno in (errno.ELOOP, errno.ENOTDIR)


def test_a_fifo_where_a_file_was_is_refused_without_waiting_for_a_writer(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "model.bin")
    with pytest.raises(OSError, match="not a regular file") as refused:  # a blocking open would wait here forever
        beneath.open_file_beneath(tmp_path, tmp_path / "model.bin")
    assert refused.value.errno == errno.EINVAL and refused.value.filename == "model.bin"
    assert beneath.regular_files(tmp_path) == []


def test_listings_neither_follow_nor_list_links(tmp_path: Path, outside: Path) -> None:
    output = tmp_path / "output"
    checkpoint = output / "checkpoint-5"
    (checkpoint / "sub").mkdir(parents=True)
    (checkpoint / "sub" / "shard.bin").write_bytes(b"s")
    (checkpoint / COMPLETE_MARKER).write_text("")
    (checkpoint / "linked-dir").symlink_to(outside, target_is_directory=True)
    (checkpoint / "linked-file").symlink_to(outside / "secret")
    (output / "adapter.safetensors").write_bytes(b"w")
    (output / "elsewhere").symlink_to(outside, target_is_directory=True)

    assert checkpoint_files(checkpoint) == [checkpoint / "sub" / "shard.bin"]
    assert [key for _, key in output_files(output)] == ["adapter.safetensors"]
    assert beneath.regular_files(output / "elsewhere") == []


def test_the_final_output_is_read_through_the_file_opened_not_its_name(tmp_path: Path, outside: Path) -> None:
    """What a store reads by name (``pinned``) is the file opened then, whatever the trainer swaps afterwards."""
    output = tmp_path / "output"
    (output / "final").mkdir(parents=True)
    (output / "final" / "adapter.safetensors").write_bytes(b"the trainer's weights")
    with beneath.pinned(output, output / "final" / "adapter.safetensors") as name:
        (output / "final").rename(output / "old")
        (output / "final").symlink_to(outside, target_is_directory=True)
        (outside / "adapter.safetensors").write_text("the runner's")
        assert name.read_bytes() == b"the trainer's weights"
    with pytest.raises(OSError):
        beneath.open_file_beneath(output, output / "final" / "adapter.safetensors")


def test_the_hand_over_changes_nothing_a_link_or_a_hard_link_leads_to(
    tmp_path: Path, outside: Path, nobody: TrainerUser
) -> None:
    work = tmp_path / "work"
    output = work / "output"
    (output / "checkpoint-5").mkdir(parents=True)
    (output / "checkpoint-5" / "model.bin").write_bytes(b"restored by root")
    (output / "checkpoint-5" / "to-root").symlink_to(outside, target_is_directory=True)
    (output / "file-link").symlink_to(outside / "secret")
    os.link(outside / "secret", output / "hard-link")  # root may; a trainer only where protected_hardlinks is off
    before = owners(outside)

    nobody.hand_over(work, [output, work / "home"])

    assert owners(outside) == before and set(before.values()) == {0}
    assert (output / "checkpoint-5" / "model.bin").stat().st_uid == nobody.uid
    assert (output / "checkpoint-5").stat().st_uid == output.stat().st_uid == nobody.uid
    assert (work / "home").stat().st_uid == nobody.uid
    assert (output / "hard-link").stat().st_uid == 0  # two names: it may be a file outside, left alone
    assert work.stat().st_uid == 0 and work.stat().st_gid == nobody.gid and work.stat().st_mode & 0o1070 == 0o1070


def test_the_hand_over_replaces_an_owned_directory_the_trainer_swapped_for_a_link(
    tmp_path: Path, outside: Path, nobody: TrainerUser
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "output").symlink_to(outside, target_is_directory=True)
    os.mkfifo(work / "home")
    nobody.hand_over(work, [work / "output", work / "home"])
    assert set(owners(outside).values()) == {0}
    assert not (work / "output").is_symlink() and (work / "output").is_dir()
    assert (work / "output").stat().st_uid == nobody.uid and (work / "home").is_dir()


@pytest.fixture
def swapping(tmp_path: Path, outside: Path) -> Iterator[Path]:
    """A directory below ``output/`` swapped for a link to ``outside`` and back, as fast as it goes, until the
    test is done (a thread: the way the trainer's daemon does it, without a process)."""
    output = tmp_path / "work" / "output"
    (output / "deep" / "er").mkdir(parents=True)
    done = threading.Event()
    swaps = 0

    def swap() -> None:
        nonlocal swaps
        swap_dir = output / "swap"
        while not done.is_set():
            try:
                (swap_dir / "a" / "b").mkdir(parents=True, exist_ok=True)
                (swap_dir / "a" / "b" / "f").write_bytes(b"x")
                staged = output / "staged-link"
                staged.unlink(missing_ok=True)
                staged.symlink_to(outside, target_is_directory=True)
                swap_dir.rename(output / "old")
                staged.rename(swap_dir)  # the directory is now a link to root's directory
                swap_dir.unlink()
                shutil.rmtree(output / "old")
                swaps += 1
            except OSError:
                continue

    thread = threading.Thread(target=swap, daemon=True)
    thread.start()
    try:
        while swaps < 50:
            done.wait(0.001)
        yield output
    finally:
        done.set()
        thread.join()


def test_the_hand_over_in_a_loop_against_a_swap_never_reaches_outside(
    tmp_path: Path, outside: Path, nobody: TrainerUser, swapping: Path
) -> None:
    """The race the issue found (``os.walk`` + ``lchown`` made root's files the trainer's in every run): with
    descriptors, a directory swapped for a link mid-walk is never entered, whenever the swap lands."""
    for _ in range(100):
        nobody.hand_over(swapping.parent, [swapping])
    assert set(owners(outside).values()) == {0}
    assert (swapping / "deep" / "er").stat().st_uid == nobody.uid

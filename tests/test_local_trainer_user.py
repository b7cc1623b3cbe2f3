"""The local cloud's trainer-user rule (bot/cloud/local/trainer_user.py), in every command that runs it: a bot run
as root from an interpreter, a source tree or a state dir other users cannot reach keeps its trainers as root and
says so once; a user the operator named is kept; a bot that is not root changes nothing."""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from bot.cloud.local import trainer_user
from bot.cloud.local.provider import LocalCloud
from bot.cloud.local.trainer_user import out_of_reach, trainer_stays_with_root


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A folder every user may enter (pytest's own are 0700)."""
    folder = Path(tempfile.mkdtemp(prefix="finetune-trainer-user-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def programs(open_dir: Path) -> tuple[Path, Path]:
    """A program in a folder only its owner may enter, and one in a folder anyone may enter."""
    private, shared = open_dir / "private", open_dir / "shared"
    for folder, mode in ((private, 0o700), (shared, 0o755)):
        folder.mkdir()
        (folder / "python").write_bytes(b"")
        (folder / "python").chmod(0o755)
        folder.chmod(mode)
    return private / "python", shared / "python"


def test_what_is_out_of_reach_is_named_with_what_closes_it_and_a_link_is_followed_both_ways(
    programs: tuple[Path, Path],
) -> None:
    private, shared = programs
    reachable = all(folder.stat().st_mode & 0o001 for folder in shared.parents)
    if not reachable:
        pytest.skip("the temporary folder is out of other users' reach itself")
    assert out_of_reach(private) == (private, private.parent)
    assert out_of_reach(shared, shared.parent, shared.parent / "not-made-yet" / "state") is None
    link = shared.parent / "link-to-private"
    link.symlink_to(private)
    assert out_of_reach(link) == (link, private.parent)  # the way to its target is closed
    inner = private.parent / "open-inside"  # open itself, but inside the closed folder
    inner.mkdir(mode=0o755)
    inner.chmod(0o755)
    into = shared.parent / "link-inside-private"
    into.symlink_to(inner, target_is_directory=True)
    assert out_of_reach(shared, into / "state") == (into / "state", private.parent)
    assert out_of_reach(shared, private.parent / "state") == (private.parent / "state", private.parent)
    shared.chmod(0o750)
    assert out_of_reach(shared) == (shared, shared)  # the program itself: not executable by others


def test_root_keeps_its_trainers_when_the_interpreter_is_out_of_reach_and_says_so(
    programs: tuple[Path, Path], open_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    private, _ = programs
    monkeypatch.setattr(trainer_user.os, "geteuid", lambda: 0)
    monkeypatch.setattr(sys, "executable", str(private))
    said = trainer_stays_with_root(open_dir / "state", {})
    assert said == (
        f"the trainers of local jobs run as root: {private.parent} is closed to other users, so the unprivileged "
        f"trainer user could not reach {private}; set FINETUNE_TRAINER_USER=<user> (one who can) to choose their user"
    )
    assert trainer_stays_with_root(open_dir / "state", {"FINETUNE_TRAINER_USER": "finetune-train"}) is None
    monkeypatch.setattr(trainer_user.os, "geteuid", lambda: 1000)  # not root: the runner cannot switch anyway
    assert trainer_stays_with_root(open_dir / "state", {}) is None


def test_a_state_dir_out_of_reach_keeps_them_too(
    programs: tuple[Path, Path], open_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, shared = programs
    if out_of_reach(shared, trainer_user._SOURCE_TREE) is not None:
        pytest.skip("this checkout or the temporary folder is out of other users' reach itself")
    monkeypatch.setattr(trainer_user.os, "geteuid", lambda: 0)
    monkeypatch.setattr(sys, "executable", str(shared))
    assert trainer_stays_with_root(open_dir / "state", {}) is None  # everything in reach: nothing changes
    closed = open_dir / "closed"
    closed.mkdir(mode=0o700)
    closed.chmod(0o700)
    said = trainer_stays_with_root(closed / "state", {})
    assert said is not None and f"{closed} is closed to other users, so the unprivileged trainer user" in said
    assert f"could not reach {closed / 'state'};" in said


def test_the_local_cloud_applies_the_rule_to_its_runners_and_keeps_a_named_user(
    programs: tuple[Path, Path], open_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    private, _ = programs
    monkeypatch.setattr(trainer_user.os, "geteuid", lambda: 0)
    monkeypatch.setattr(sys, "executable", str(private))
    monkeypatch.delenv("FINETUNE_TRAINER_USER", raising=False)
    cloud = LocalCloud(open_dir / "state")
    assert cloud.runner_env["FINETUNE_TRAINER_USER"] == "root" and cloud.trainer_note is not None
    named = LocalCloud(open_dir / "state", runner_env={"FINETUNE_TRAINER_USER": "nobody"})
    assert named.runner_env["FINETUNE_TRAINER_USER"] == "nobody" and named.trainer_note is None
    monkeypatch.setenv("FINETUNE_TRAINER_USER", "nobody")  # the operator's, passed to the instances as it is
    assert "FINETUNE_TRAINER_USER" not in LocalCloud(open_dir / "state").runner_env

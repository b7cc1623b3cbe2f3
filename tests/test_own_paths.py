"""The runner's own secrets are in no file the trainer's user can name: its environment file (on Alibaba it holds
the attempt's key) is root's alone, and no directory on the way to it or to the work directory is the trainer's.

Real files, owners and modes (root needed, as the runner that checks them is root); the last test starts a real
runner as root on a work directory below one of the trainer's user, which must start nothing.
"""

from __future__ import annotations

import asyncio
import os
import pwd
from pathlib import Path

import pytest

from bot.cloud.user_data import RUNNER_ENV_FILE as BOOT_SCRIPT_ENV_FILE
from bot.cloud.user_data import runner_boot_script
from runner.own_paths import check_env_file, check_own_paths, open_own_dir
from tests.runner_harness import read_reports, runner_env, start_runner, write_spec


@pytest.fixture
def nobody() -> pwd.struct_passwd:
    if os.geteuid() != 0:
        pytest.skip("owners and the trainer's user need a root runner")
    return pwd.getpwnam("nobody")


def env_file(place: Path, mode: int = 0o600) -> Path:
    path = place / "etc" / "finetune-runner.env"
    path.parent.mkdir(parents=True)
    path.write_text("FINETUNE_REPORT_SECRET=attempt-key-3f1c\n")
    path.chmod(mode)
    return path


@pytest.mark.unit
def test_a_readable_environment_file_is_made_roots_alone(tmp_path: Path, nobody: pwd.struct_passwd) -> None:
    path = env_file(tmp_path, 0o644)
    check_env_file(path)
    assert path.stat().st_mode & 0o777 == 0o600 and path.stat().st_uid == 0
    check_env_file(tmp_path / "etc" / "none-here.env")  # none at all: nothing to keep


@pytest.mark.unit
def test_an_environment_file_someone_else_can_name_is_refused(tmp_path: Path, nobody: pwd.struct_passwd) -> None:
    path = env_file(tmp_path)
    os.chown(path, nobody.pw_uid, nobody.pw_gid)
    with pytest.raises(PermissionError, match="belongs to uid"):
        check_env_file(path)
    os.chown(path, 0, 0)
    os.chown(path.parent, nobody.pw_uid, nobody.pw_gid)  # its directory the trainer's: the file could be replaced
    with pytest.raises(PermissionError, match="belongs to uid"):
        check_env_file(path)
    os.chown(path.parent, 0, 0)
    path.parent.chmod(0o777)  # writable by all, not sticky: anyone may replace the name
    with pytest.raises(PermissionError, match="not sticky"):
        check_env_file(path)
    path.parent.chmod(0o755)
    os.link(path, tmp_path / "second-name")
    with pytest.raises(PermissionError, match="one name"):
        check_env_file(path)
    (tmp_path / "second-name").unlink()
    path.rename(tmp_path / "real.env")
    path.symlink_to(tmp_path / "real.env")
    with pytest.raises(PermissionError, match="not a plain file"):
        check_env_file(path)


@pytest.mark.unit
def test_the_boot_script_and_the_runner_name_one_environment_file_written_roots_alone() -> None:
    script = runner_boot_script({"FINETUNE_SPEC": "oss://b/jobs/ft-1/spec-attempt-1.json"}, "/opt/finetune")
    lines = script.splitlines()
    made = lines.index(f"install -m 0600 -o root -g root /dev/null {BOOT_SCRIPT_ENV_FILE}")
    assert made < lines.index(f"cat > {BOOT_SCRIPT_ENV_FILE} <<'ENV'")  # 0600 before a byte is in it


@pytest.mark.unit
def test_a_work_directory_below_one_of_the_trainers_is_refused(tmp_path: Path, nobody: pwd.struct_passwd) -> None:
    theirs = tmp_path / "shared"
    theirs.mkdir()
    os.chown(theirs, nobody.pw_uid, nobody.pw_gid)
    with pytest.raises(PermissionError, match="belongs to uid"):
        check_own_paths(theirs / "job" / "attempt-1", tmp_path / "no.env")
    link = tmp_path / "finetune-runner"
    link.symlink_to("/etc", target_is_directory=True)
    os.lchown(link, nobody.pw_uid, nobody.pw_gid)  # the trainer's link to /etc where the work dir would be
    with pytest.raises(PermissionError, match="is a link of uid"):
        check_own_paths(link, tmp_path / "no.env")
    ours = tmp_path / "ours" / "job" / "attempt-1"
    check_own_paths(ours, tmp_path / "no.env")  # made on the way, root's
    assert ours.is_dir() and ours.stat().st_uid == 0
    (tmp_path / "via-link").symlink_to(ours, target_is_directory=True)  # a link of root's, like /var/run
    fd = open_own_dir(tmp_path / "via-link")
    try:
        assert os.path.samestat(os.fstat(fd), ours.stat())
    finally:
        os.close(fd)


async def test_a_runner_whose_work_directory_the_trainer_could_swap_starts_nothing(
    tmp_path: Path, nobody: pwd.struct_passwd
) -> None:
    theirs = tmp_path / "shared"
    theirs.mkdir()
    os.chown(theirs, nobody.pw_uid, nobody.pw_gid)
    reports = tmp_path / "reports.jsonl"
    spec = write_spec(tmp_path / "spec.json", checkpoint_uri=f"file://{tmp_path}/store/", report=[f"file://{reports}"])
    runner = await start_runner(spec, theirs / "work", runner_env(FINETUNE_TRAINER_USER="nobody"))
    assert await asyncio.wait_for(runner.wait(), 60) == 2
    assert "belongs to uid" in (theirs / "work-runner.log").read_text()
    assert read_reports(reports) == [] and not (theirs / "work").exists() and not (tmp_path / "store").exists()

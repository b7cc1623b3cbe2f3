"""The trainer stays in its box: a real root runner, a trainer run as a real unprivileged user made for the test,
doing what the issue found a model's code can do.

Each start, the trainer forks a daemon into a session of its own (it keeps the trainer's output pipe open and
swaps ``output/swap`` between a directory and a link to a directory of root's outside the work directory, as fast
as it can) and turns its progress file into a FIFO. The first two starts crash (``max_restarts`` is 2, so the
runner restarts it twice; the second leaves a link to root's directory where ``output/`` was); the third
writes a checkpoint and waits. Then a spot notice comes through the local
metadata service, as on an instance. The runner must end each daemon before the next start (the trainer looks for
the last one's pid when it starts), change the owner of nothing outside the work directory, read no FIFO, and
still commit the checkpoint and report before the deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pwd
import secrets
import shutil
import signal
import stat
import subprocess
import tempfile
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from bot.cloud.local.metadata import LocalMetadataServer
from runner.manifest import COMPLETE_MARKER
from tests.runner_harness import of_type, read_reports, runner_env, start_runner, wait_until, write_spec

pytestmark = pytest.mark.scenario

TRAINER = r"""
set -u
out="$FINETUNE_OUTPUT_DIR"
echo "$$" >> "$HOME/starts"
n=$(wc -l < "$HOME/starts")
if [ -s "$HOME/daemon.pid" ]; then
  if kill -0 "$(cat "$HOME/daemon.pid")" 2>/dev/null; then echo alive; else echo gone; fi > "$HOME/daemon-at-start-$n"
  rm -f "$HOME/daemon.pid"
fi
setsid sh -c '
  echo $$ > "$HOME/daemon.pid.tmp" && mv "$HOME/daemon.pid.tmp" "$HOME/daemon.pid"
  echo "$$" >> "$HOME/daemons"
  while :; do
    mkdir -p "$FINETUNE_OUTPUT_DIR/swap/a" && : > "$FINETUNE_OUTPUT_DIR/swap/a/f"
    rm -rf "$FINETUNE_OUTPUT_DIR/swap"
    ln -s "$ROOT_DIR" "$FINETUNE_OUTPUT_DIR/swap"
    ln -s "$ROOT_DIR/secret" "$FINETUNE_OUTPUT_DIR/secret-link" 2>/dev/null
    rm -f "$FINETUNE_OUTPUT_DIR/swap"
  done' &
until [ -s "$HOME/daemon.pid" ]; do sleep 0.02; done
rm -f "$FINETUNE_PROGRESS_FILE"
mkfifo "$FINETUNE_PROGRESS_FILE"
echo "start $n: daemon $(cat "$HOME/daemon.pid") swapping, progress file a FIFO"
if [ "$n" -eq 2 ]; then mv "$out" "$out.moved" && ln -s "$ROOT_DIR" "$out"; fi
if [ "$n" -lt 3 ]; then exit 1; fi
mkdir -p "$out/checkpoint-3"
echo weights > "$out/checkpoint-3/model.bin"
: > "$out/checkpoint-3/MARKER"
: > "$HOME/ready"
while :; do sleep 0.1; done
""".replace("MARKER", COMPLETE_MARKER)

SECRET = b"the attempt's key: 5d1f0c"


def processes_of(uid: int) -> list[int]:
    """Live processes (not zombies) whose real uid is ``uid``."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            status = Path(entry.path, "status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if int(fields["Uid"].split()[0]) == uid and fields["State"].split()[0] not in ("Z", "X"):
            found.append(int(entry.name))
    return found


@pytest.fixture
def trainer_account() -> Iterator[pwd.struct_passwd]:
    """An unprivileged user of the test's own (no other test's processes run as it), removed afterwards with
    every process this test started as it."""
    if os.geteuid() != 0:
        pytest.skip("a trainer of another user needs a root runner")
    name = f"ft-box-{secrets.token_hex(3)}"
    made = subprocess.run(
        ["useradd", "--system", "--user-group", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
        capture_output=True,
        check=False,
    )
    if made.returncode != 0:
        pytest.skip(f"cannot create a user here: {made.stderr.decode(errors='replace').strip()}")
    account = pwd.getpwnam(name)
    try:
        yield account
    finally:
        for pid in processes_of(account.pw_uid):  # only this test's: the user is its own
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        subprocess.run(["userdel", name], capture_output=True, check=False)


@pytest.fixture
def reachable() -> Iterator[Path]:
    """Outside pytest's private temporary directories (0700), where the trainer's user can reach it."""
    path = Path(tempfile.mkdtemp(prefix="finetune-box-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    if not os.environ.get("BOX_KEEP"):
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
async def imds() -> AsyncIterator[LocalMetadataServer]:
    server = await LocalMetadataServer(instance_id="i-0box").start()
    yield server
    await server.stop()


def owners(place: Path) -> dict[str, tuple[int, int]]:
    found = {".": (place.lstat().st_uid, place.lstat().st_gid)}
    for dirpath, dirs, files in os.walk(place):
        for name in [*dirs, *files]:
            info = (Path(dirpath) / name).lstat()
            found[str((Path(dirpath) / name).relative_to(place))] = (info.st_uid, info.st_gid)
    return found


async def test_a_trainer_that_leaves_a_daemon_swaps_links_and_plants_a_fifo_stays_in_its_box(
    tmp_path: Path, reachable: Path, trainer_account: pwd.struct_passwd, imds: LocalMetadataServer
) -> None:
    root_dir = reachable / "root-owned"  # outside the work directory; the trainer may read it, not change it
    (root_dir / "inner").mkdir(parents=True)
    (root_dir / "secret").write_bytes(SECRET)
    (root_dir / "inner" / "file").write_text("root's")
    before = owners(root_dir)
    assert {owner for owner, _ in before.values()} == {0}

    store, reports, work = tmp_path / "store", tmp_path / "reports.jsonl", reachable / "work"
    spec = write_spec(
        tmp_path / "spec.json",
        checkpoint_uri=f"file://{store}/",
        report=[f"file://{reports}"],
        command=["/bin/sh", "-c", TRAINER],
        env={"ROOT_DIR": str(root_dir)},
        notice="aws",
        max_restarts=2,
    )
    env = runner_env(
        FINETUNE_TRAINER_USER=trainer_account.pw_name,
        AWS_EC2_METADATA_SERVICE_ENDPOINT=imds.endpoint,
        FINETUNE_SYNC_SECONDS="600",  # no periodic commit: checkpoint-3 goes up on the notice
        FINETUNE_REPORT_RESERVE_SECONDS="3",
    )
    runner = await start_runner(spec, work, env, new_session=True)
    log = reachable / "work-runner.log"
    try:
        with contextlib.suppress(TimeoutError):
            await wait_until(lambda: (work / "home" / "ready").exists() or runner.returncode is not None, 60)
        assert (work / "home" / "ready").exists(), log.read_text()[-3000:]
        deadline = imds.interrupt(seconds=60)
        left = (deadline - datetime.now(UTC)).total_seconds()
        code = await asyncio.wait_for(runner.wait(), left)  # it must be done before the machine goes
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(runner.pid, signal.SIGKILL)
        await runner.wait()
    assert code == 75, log.read_text()[-3000:]

    got = read_reports(reports)
    restarts = [r for r in of_type(got, "warning") if r["kind"] == "trainer-restart"]
    assert [("restart 1 of 2" in r["message"], "restart 2 of 2" in r["message"]) for r in restarts] == [
        (True, False),
        (False, True),
    ]
    [interrupted] = of_type(got, "interrupted")
    assert interrupted["step"] == 3 and interrupted["uri"] == f"file://{store}/checkpoint-3/"
    assert (store / "checkpoint-3" / "MANIFEST.json").exists()
    assert (store / "checkpoint-3" / "model.bin").read_bytes() == b"weights\n"

    home = work / "home"
    daemons = (home / "daemons").read_text().split()
    assert len(daemons) == 3  # each start left one
    for start in (2, 3):  # the one before was gone when the next trainer started
        assert (home / f"daemon-at-start-{start}").read_text().strip() == "gone"
    assert processes_of(trainer_account.pw_uid) == []  # and nothing of the trainer's outlived the attempt

    assert owners(root_dir) == before  # nothing outside the work directory changed owner
    assert (work / "output.moved").is_dir() and not (work / "output").is_symlink()  # the link was replaced
    assert (root_dir / "secret").read_bytes() == SECRET
    stored = [path.read_bytes() for path in store.rglob("*") if path.is_file()]
    assert stored and not any(SECRET in data for data in stored)
    assert stat.S_ISFIFO((work / "progress.jsonl").lstat().st_mode)  # the runner faced the FIFO, and went on
    assert "killed" in log.read_text() and "the trainer left behind" in log.read_text()

"""The console trial, as a newcomer runs it (as root on a development host): ``finetune-bot chat`` from an
interpreter in a folder only its owner may enter (a virtualenv under ``/root``, mode 0700), then ``start tiny``.

The real CLI in a real pseudo-terminal (pexpect), its embedded Valkey, the local cloud's instance and runner
processes and the real tiny trainer. The job finishes, ``chart`` writes a PNG that decodes and prints its path,
``logs`` shows what the trainer printed, ``history`` the job's record, ``stat`` gets "did you mean status", and the
console's own user sees the costs. A trainer user the operator named that cannot reach the interpreter fails the
job with a sentence naming that user and the fix.
"""

from __future__ import annotations

import io
import os
import re
import shutil
import sys
import sysconfig
import tempfile
import venv
from collections.abc import Iterator
from pathlib import Path

import pexpect
import pytest
from matplotlib import image

pytestmark = pytest.mark.scenario  # real subprocesses (tests/markers.py)

TIMEOUT = 180  # a failure's bound only: each step waits on what it expects, however soon that comes
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
HISTORY_LINE = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d created ")


@pytest.fixture
def private_python(tmp_path: Path) -> Path:
    """A virtualenv in a folder only its owner may enter, seeing the packages of the interpreter running the tests."""
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    home.chmod(0o700)
    env_dir = home / "venv"
    venv.EnvBuilder(symlinks=True, with_pip=False).create(env_dir)
    site_packages = Path(sysconfig.get_path("purelib", vars={"base": str(env_dir), "platbase": str(env_dir)}))
    ours = sysconfig.get_path("purelib")
    (site_packages / "_finetune_project.pth").write_text(f"import site; site.addsitedir({ours!r})\n")
    return env_dir / "bin" / "python"


@pytest.fixture
def open_state_dir() -> Iterator[Path]:
    """A state directory every user may enter (pytest's own are 0700): only the interpreter is out of reach."""
    folder = Path(tempfile.mkdtemp(prefix="finetune-console-trial-"))
    folder.chmod(0o755)
    yield folder / "state"
    shutil.rmtree(folder, ignore_errors=True)


def chat(python: Path, state_dir: Path, **extra: str) -> pexpect.spawn:
    env = {key: value for key, value in os.environ.items() if key not in ("REDIS_URL", "FINETUNE_TRAINER_USER")}
    env.update(
        {
            "FINETUNE_STATE_DIR": str(state_dir),
            "FINETUNE_HTTP_PORT": "0",
            "FINETUNE_LOG_LEVEL": "INFO",
            "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
            "TERM": "xterm",
            "PROMPT_TOOLKIT_NO_CPR": "1",
            **extra,
        }
    )
    child = pexpect.spawn(
        str(python), ["-m", "bot.cli", "chat"], env=env, dimensions=(60, 400), encoding="utf-8", timeout=TIMEOUT
    )
    child.logfile_read = io.StringIO()  # the whole screen, for what must not be on it
    child.expect("type 'help'")
    return child


def at_prompt(child: pexpect.spawn) -> None:
    """Wait until the prompt is drawn again: only then is the terminal raw, so Ctrl-D reaches the prompt (between
    two prompts it is cooked, and a Ctrl-D is gone before the next prompt reads)."""
    child.expect_exact("/finetune")


def screen(child: pexpect.spawn) -> str:
    shown = child.logfile_read
    assert isinstance(shown, io.StringIO)
    return shown.getvalue()


def test_the_private_python_is_out_of_other_users_reach_and_runs_the_bot(private_python: Path) -> None:
    """The fixture is the case: the interpreter runs, and a user with no group in common could not enter its
    folder."""
    assert not private_python.parent.parent.parent.stat().st_mode & 0o001
    assert pexpect.run(f"{private_python} -c 'import bot, aiohttp, matplotlib; print(42)'", timeout=60).strip() == b"42"


def test_the_console_trial_as_root_finishes_a_tiny_job_and_shows_its_chart_log_history_and_costs(
    private_python: Path, open_state_dir: Path
) -> None:
    child = chat(private_python, open_state_dir)
    try:
        if os.geteuid() == 0:  # the trainer stays with root, and the console says why and how to choose
            child.expect_exact("(the trainers of local jobs run as root: ")
            child.expect_exact(" is closed to other users, so the unprivileged trainer user could not reach ")
            child.expect_exact(f"{private_python};")
            child.expect_exact("set FINETUNE_TRAINER_USER=<user> (one who can) to choose their user)")
        child.sendline("stat")
        child.expect_exact("unknown command 'stat': did you mean status?")
        child.sendline("start tiny steps=12 save_steps=4 step_seconds=0")
        child.expect(r"Starting (ft-[a-z0-9]+)")
        job = child.match.group(1)
        child.expect(rf"✅ {job} finished: 1 attempt\(s\)")

        child.sendline(f"chart {job}")
        child.expect_exact(f"📈 Drawing the chart of {job}: the path of its PNG file follows.")
        child.expect(rf"the chart is in (\S+/{job}-\S+\.png)")
        chart = Path(child.match.group(1))

        child.sendline(f"logs {job}")
        child.expect_exact(f"📜 {job}: the last ")
        child.expect_exact("of the trainer's log (attempt 1)")
        child.expect_exact('{"global_step": 12, "interrupted": false}')  # the tiny trainer's last line

        child.sendline(f"history {job}")
        child.expect(HISTORY_LINE)

        child.sendline("costs")  # the console's user is an admin of its console: every team's spend
        child.expect(r"💰 Costs of the last 7 days \(.*\), every team: 1 jobs")
        at_prompt(child)
        child.sendeof()
        child.expect("Bye.")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0
    assert chart.parent == (open_state_dir / "charts").resolve()
    assert chart.read_bytes().startswith(PNG_SIGNATURE)
    pixels = image.imread(chart)
    assert pixels.ndim == 3 and pixels.shape[0] > 200 and pixels.shape[1] > 200
    assert pixels.std() > 0.01  # drawn: not one flat colour


@pytest.mark.skipif(os.geteuid() != 0, reason="a runner switches its trainer's user only as root")
def test_a_trainer_user_who_cannot_reach_the_interpreter_fails_the_job_naming_the_user_and_the_fix(
    private_python: Path, open_state_dir: Path
) -> None:
    child = chat(private_python, open_state_dir, FINETUNE_TRAINER_USER="nobody")
    try:
        child.sendline("start tiny")
        child.expect(r"Starting (ft-[a-z0-9]+)")
        child.expect(
            rf"cannot start the trainer: '{re.escape(str(private_python))}' is out of reach of its user nobody "
            r"\(a folder on the way is closed to nobody\); install it where nobody can reach it, or set "
            r"FINETUNE_TRAINER_USER to a user who can"
        )
        at_prompt(child)
        child.sendeof()
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert "the trainers of local jobs run as root" not in screen(child)  # the operator named the user: kept
    assert "Traceback" not in screen(child)


def test_the_console_runs_on_the_bot_s_python_with_no_trainer_note_when_the_user_is_named(tmp_path: Path) -> None:
    """The note is said only where it changes something: with the user named, nothing is said."""
    child = chat(Path(sys.executable), tmp_path / "state", FINETUNE_TRAINER_USER="root")
    try:
        child.sendline("help")
        child.expect_exact("/finetune history <job> — the job's history, with times")
        child.sendline("list")
        child.expect_exact("no jobs yet: /finetune start tiny")  # the whole reply: its "/finetune" is not the prompt
        at_prompt(child)
        child.sendeof()
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert "the trainers of local jobs run as root" not in screen(child)

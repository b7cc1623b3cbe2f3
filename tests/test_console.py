"""``finetune-bot chat`` in a real pseudo-terminal: keys in, screen out (pexpect drives the real CLI).

Updates that arrive while a command is half typed are printed above the prompt and the half-typed line survives;
Ctrl-C and Ctrl-D leave cleanly and say what becomes of the local jobs; log lines go to a file, not the screen.
"""

from __future__ import annotations

import io
import json
import re
import sys
import time
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pexpect

from fakes.bot_harness import SECRET, SLEEPS, quick_recipe, report_headers, write_config
from fakes.ports import free_port
from handlers.reports import Notice
from tests.test_bot_cli import bot_env
from tests.test_outside_text import LOUD

TIMEOUT = 90
REDRAWN_HALF = re.compile(r"/finetune ?(?:\x1b\[[0-9;?]*[A-Za-z])*histor")
HISTORY_LINE = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d created ")


def spawn(tmp_path: Path, **env: str) -> pexpect.spawn:
    child = pexpect.spawn(
        sys.executable,
        ["-m", "bot.cli", "chat"],
        # A terminal that does not answer cursor-position requests, as pexpect's does not.
        env=bot_env(tmp_path, TERM="xterm", PROMPT_TOOLKIT_NO_CPR="1", **env),
        dimensions=(40, 240),
        encoding="utf-8",
        timeout=TIMEOUT,
    )
    child.expect("type 'help'")
    child.expect_exact("/finetune")
    return child


def at_prompt(child: pexpect.spawn) -> None:
    """Wait until the prompt is drawn again: only then is the terminal raw, so Ctrl-C / Ctrl-D reach the prompt.

    Between two prompts the terminal is cooked: there a Ctrl-D is the line discipline's end of file, gone before
    the next prompt reads, and a Ctrl-C is a SIGINT.
    """
    child.expect_exact("/finetune")


def launched_salt(tmp_path: Path, job_id: str, attempt: int) -> str:
    """The key salt the bot launched the attempt with: in the spec the local cloud wrote for its instance."""
    for written in tmp_path.rglob("launch-spec.json"):
        spec = json.loads(written.read_text())
        if (spec["job_id"], spec["attempt"]) == (job_id, attempt):
            return str(spec["key_salt"])
    raise AssertionError(f"no instance launched for {job_id} attempt {attempt}")


def post_report(port: int, body: bytes, salt: str) -> None:
    now = int(time.time())
    headers = report_headers(body, now, salt=salt)
    request = urllib.request.Request(f"http://127.0.0.1:{port}/runner/reports", data=body, headers=headers)
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 202


def test_updates_go_above_a_half_typed_command_and_ctrl_c_leaves_cleanly(tmp_path: Path) -> None:
    port = free_port()
    config = write_config(tmp_path / "bot.yaml", recipes=[quick_recipe("sleepy", SLEEPS)])
    child = spawn(tmp_path, FINETUNE_HTTP_PORT=str(port), FINETUNE_REPORT_SECRET=SECRET, FINETUNE_CONFIG=str(config))
    try:
        child.sendline("start sleepy")
        child.expect(r"Starting (ft-[a-z0-9]+)")
        job = child.match.group(1)
        child.expect("RUNNING")  # the job card, printed when the job's state changes

        child.send("histor")  # half a command: then an update arrives, from outside, while the line waits
        child.expect_exact("histor")
        deadline = datetime.now(UTC) + timedelta(minutes=10)
        notice = Notice(job_id=job, attempt=1, kind="spot-interruption", source="test", deadline=deadline)
        post_report(port, notice.model_dump_json().encode(), launched_salt(tmp_path, job, 1))
        child.expect("Spot interruption warning")
        child.expect(REDRAWN_HALF)  # the prompt is drawn again below the update, with the half-typed word on it
        child.sendline(f"y {job}")  # the rest of it: the line typed before the update is intact
        child.expect(HISTORY_LINE)
        child.expect(r"notice|spot-interruption")
        at_prompt(child)

        child.send("\x03")  # Ctrl-C at the prompt
        child.expect(f"The local instances of {job} stop within a minute of this bot")
        child.expect(pexpect.EOF)
        screen = child.before
    finally:
        child.close(force=True)
    assert child.exitstatus == 0, screen
    assert "Traceback" not in screen and " INFO " not in screen
    log_text = (tmp_path / "state" / "bot.log").read_text()
    assert "bot up" in log_text  # the bot's log lines went to the file


def test_a_trainers_log_line_with_markers_and_escapes_reaches_the_terminal_as_text(tmp_path: Path) -> None:
    config = write_config(tmp_path / "bot.yaml", recipes=[LOUD])
    child = spawn(tmp_path, FINETUNE_HTTP_PORT="0", FINETUNE_CONFIG=str(config))
    screen = io.StringIO()
    child.logfile_read = screen  # every byte the terminal got from here on
    try:
        child.sendline("start loud")
        child.expect(r"Starting (ft-[a-z0-9]+)")
        child.expect("gave up after 2 restart")
        child.expect_exact("slack:U0EVE <!here> <@U0EVE> RED @all done")  # the line, shown as text
        at_prompt(child)
        child.sendeof()
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    printed = screen.getvalue()
    # The trainer's colour, its window title and the person markers never reached the terminal as themselves.
    assert "\x1b[31mRED" not in printed and "\x1b]0;pwned" not in printed and "\x07" not in printed
    assert "\ue000" not in printed and "\ue001" not in printed


def test_help_and_ctrl_d(tmp_path: Path) -> None:
    child = spawn(tmp_path, FINETUNE_HTTP_PORT="0")
    try:
        child.sendline("help")
        child.expect("resume <job> \\[on-demand\\] — continue a failed or stopped job")
        child.expect("Recipes")
        child.expect(r"steps=30  int, 1…10000")
        child.sendline("list")
        child.expect_exact("no jobs yet: /finetune start tiny")  # the whole reply: its "/finetune" is not the prompt
        at_prompt(child)
        child.sendeof()  # Ctrl-D
        child.expect("Bye.")
        child.expect(pexpect.EOF)
        screen = child.before
    finally:
        child.close(force=True)
    assert child.exitstatus == 0 and "Traceback" not in screen, screen


def test_list_shows_the_step_out_of_the_total(tmp_path: Path) -> None:
    code = "import json, os, time\n" + "\n".join(
        [
            "open(os.environ['FINETUNE_PROGRESS_FILE'], 'a').write(json.dumps({'step': 4}) + '\\n')",
            "time.sleep(600)",
        ]
    )
    recipe = quick_recipe("counted", code)
    recipe["command"] = [*recipe["command"], "{steps}"]
    recipe["parameters"] = {"steps": {"type": "int", "default": 300, "min": 1, "max": 1000}}
    recipe["total_steps_param"] = "steps"
    config = write_config(tmp_path / "bot.yaml", recipes=[recipe])
    child = spawn(tmp_path, FINETUNE_HTTP_PORT="0", FINETUNE_CONFIG=str(config))
    try:
        child.sendline("start counted steps=250")
        child.expect(r"Starting (ft-[a-z0-9]+)")
        job = child.match.group(1)
        child.sendline("list")
        child.expect(rf"{job}\s+\S+\s+counted\s+step \d+/250")
        seen = None
        for _ in range(120):  # until its first progress report is in
            child.sendline("list")
            child.expect(rf"{job}\s+\S+\s+counted\s+step (\d+)/250")
            seen = int(child.match.group(1))
            if seen == 4:
                break
            time.sleep(0.5)
        assert seen == 4
        at_prompt(child)
        child.sendeof()
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert json.dumps(child.exitstatus) == "0"

"""Every command block of the local quickstart (docs/quickstart.md) runs, in order, as a reader types them; so do
those of "Slack from your laptop" (docs/quickstart-slack.md, up to its AWS part) and "DingTalk in five steps"
(docs/quickstart-dingtalk.md), against the fake Slack in Socket Mode and the fake DingTalk Stream gateway, with the
fake's tokens pasted where the reader pastes theirs.

The ```` ```sh ```` blocks (and the ``$`` lines of a ```` ```console ```` block) go into one bash script, run with
``-e`` in a folder laid out as a checkout after ``make``: the Makefile and pyproject.toml, ``bench/`` (the spot
traces), and ``.venv`` pointing at the interpreter running the tests, stamped as installed so ``make demo`` starts
at once. Each guide's first block runs ``make demo``: that command runs once for the three (``make_demo``,
tests/demo_checkout.py), and each guide's blocks run in a copy of the checkout it left, its output standing in its
place. A block a test cannot type (the interactive chat) says so on the line before it with
``<!-- not run: interactive -->``; there may be at most :data:`MAX_NOT_RUN` of them.
"""

from __future__ import annotations

import asyncio
import re
import signal
import subprocess
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from fakes.fake_dingtalk import FakeDingTalk, group_message, message_frame
from fakes.fake_slack import APP_TOKEN, BOT_TOKEN, FakeSlack, slash_command
from fakes.ports import free_port
from tests.demo_checkout import Demo, reader_env

ROOT = Path(__file__).resolve().parent.parent
QUICKSTART = ROOT / "docs" / "quickstart.md"
SLACK_QUICKSTART = ROOT / "docs" / "quickstart-slack.md"
SLACK_AWS_PART = "## The bot on my laptop, the runners on AWS"  # needs an AWS account: docs/aws.md's steps
DINGTALK_QUICKSTART = ROOT / "docs" / "quickstart-dingtalk.md"
DINGTALK_CONFIG_PART = "## Next: alerts, cards, groups"
NOT_RUN = "<!-- not run: interactive -->"
MAX_NOT_RUN = 1
COMMAND_LANGUAGES = ("sh", "console")
FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.M | re.S)


def command_blocks(text: str) -> tuple[list[str], list[str]]:
    """(blocks to run, blocks marked not run), each a block's commands as a reader types them."""
    run: list[str] = []
    skipped: list[str] = []
    for fence in FENCE.finditer(text):
        language, body = fence.group(1), fence.group(2)
        if language not in COMMAND_LANGUAGES:
            continue
        before = text[: fence.start()].rstrip().splitlines()
        marked = bool(before) and before[-1].strip() == NOT_RUN
        if language == "console":
            body = "".join(line[2:] + "\n" for line in body.splitlines() if line.startswith("$ "))
        (skipped if marked else run).append(body)
    return run, skipped


@pytest.mark.unit
def test_the_quickstart_marks_few_blocks_not_run_and_runs_the_rest() -> None:
    run, skipped = command_blocks(QUICKSTART.read_text())
    assert len(skipped) <= MAX_NOT_RUN, f"{len(skipped)} blocks marked not run; at most {MAX_NOT_RUN}"
    joined = "\n".join(run)
    for command in ("make demo", "finetune-bot chat", "finetune-bot simulate"):
        assert command in joined, f"the quickstart runs no {command}"


@pytest.mark.unit
def test_blocks_are_read_as_a_reader_types_them() -> None:
    text = (
        "```sh\nmake demo\n```\n\n```text\noutput\n```\n\n"
        f"{NOT_RUN}\n```console\n$ finetune-bot chat\n/finetune help\n```\n\n"
        "```console\n$ finetune-bot --help\nusage: …\n```\n"
    )
    assert command_blocks(text) == (["make demo\n", "finetune-bot --help\n"], ["finetune-bot chat\n"])


@pytest.mark.scenario
def test_every_command_block_of_the_quickstart_runs(tmp_path: Path, make_demo: Demo) -> None:
    assert make_demo.status == 0, make_demo.failure()
    run, _ = command_blocks(QUICKSTART.read_text())
    folder, run[0] = make_demo.after_the_demo(tmp_path / "checkout", run[0])
    script = ["set -eo pipefail"]
    for number, block in enumerate(run, start=1):
        script += [f"echo '### block {number}' >&2", block]
    done = subprocess.run(
        ["bash", "-c", "\n".join(script)], cwd=folder, env=reader_env(), capture_output=True, text=True, timeout=280
    )
    reached = re.findall(r"^### block (\d+)$", done.stderr, re.M)
    assert done.returncode == 0, (
        f"quickstart block {reached[-1] if reached else '?'} failed (exit {done.returncode}):\n"
        f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )
    assert reached == [str(number) for number in range(1, len(run) + 1)]
    out = done.stdout
    assert "✔ finished" in out and "✘" not in out  # make demo's checklist
    assert "⛔ steps=999999 is above the maximum 10000" in out  # the chat's answer to a mistake
    assert '"policy": "deadline-aware"' in out and '"met_deadline": true' in out  # simulate's lines


@pytest.mark.unit
def test_the_slack_quickstart_runs_every_block_of_its_laptop_part() -> None:
    laptop, aws = SLACK_QUICKSTART.read_text().split(SLACK_AWS_PART)
    run, skipped = command_blocks(laptop)
    assert not skipped and [block.split()[0] for block in run] == ["make", "umask", "finetune-bot", "finetune-bot"]
    assert "xoxb-…" in run[1] and "xapp-…" in run[1]  # the tokens the reader pastes, which the test replaces
    assert "aws " in "".join(command_blocks(aws)[0])  # what is left out is the part that needs an AWS account


async def run_chat_quickstart(
    tmp_path: Path,
    demo: Demo,
    blocks: list[str],
    env: dict[str, str],
    connected: Callable[[], Awaitable[None]],
    talk: Callable[[], Awaitable[None]],
) -> str:
    """Run a chat quickstart's blocks as the reader does after ``demo`` (its first block), its last (``finetune-bot
    serve``) until the reader's Ctrl-C: once the bot has ``connected`` to the fake platform, ``talk`` says something
    to it. The output."""
    assert demo.status == 0, demo.failure()
    *setup, serve = blocks
    assert serve.strip() == "finetune-bot serve"
    folder, setup[0] = demo.after_the_demo(tmp_path / "checkout", setup[0])
    script = ["set -eo pipefail"]
    for number, block in enumerate(setup, start=1):
        script += [f"echo '### block {number}' >&2", block]
    script += [f"echo '### block {len(blocks)}' >&2", f"exec {serve.strip()}"]
    log = tmp_path / "out.log"
    # The bot's port one that is free here (the reader's default may be taken on a shared machine).
    env = {**reader_env(), "FINETUNE_HTTP_PORT": str(free_port()), **env}
    with log.open("wb") as out:
        bot = await asyncio.create_subprocess_exec(
            "bash", "-c", "\n".join(script), cwd=folder, env=env, stdout=out, stderr=subprocess.STDOUT
        )
    try:
        up = asyncio.ensure_future(connected())
        done, _ = await asyncio.wait({up, asyncio.ensure_future(bot.wait())}, return_when="FIRST_COMPLETED")
        assert up in done, f"the bot ended before it connected:\n{log.read_text()[-4000:]}"
        await talk()
    finally:
        if bot.returncode is None:
            bot.send_signal(signal.SIGINT)  # the reader's Ctrl-C
        status = await bot.wait()
    said = log.read_text()
    reached = re.findall(r"^### block (\d+)$", said, re.M)
    assert reached == [str(number) for number in range(1, len(blocks) + 1)], said[-4000:]
    assert "✔ finished" in said and "✘" not in said  # make demo's checklist
    checks = [line for line in said.splitlines() if line[:1] in ("✓", "✗")]
    assert checks and all(line.startswith("✓") for line in checks), "\n".join(checks)
    assert status == 0, said[-4000:]  # the Ctrl-C a clean stop
    return said


@pytest.mark.scenario
@pytest.mark.timeout(600)
async def test_the_slack_quickstart_runs_against_a_fake_slack_in_socket_mode(tmp_path: Path, make_demo: Demo) -> None:
    run, _ = command_blocks(SLACK_QUICKSTART.read_text().split(SLACK_AWS_PART)[0])
    blocks = [block.replace("xoxb-…", BOT_TOKEN).replace("xapp-…", APP_TOKEN) for block in run]
    async with FakeSlack() as slack:

        async def talk() -> None:
            envelope = await slack.send_envelope("slash_commands", slash_command("help"))
            answer = (await slack.ack_of(envelope, timeout=60))["payload"]["text"]
            assert answer.startswith("/finetune start") and "/finetune help" in answer  # every command, as in Slack

        # Slack is the fake: the one variable the reader does not set.
        said = await run_chat_quickstart(
            tmp_path, make_demo, blocks, {"SLACK_API_URL": slack.api_url}, lambda: slack.connected(timeout=540), talk
        )
    assert any(line.startswith("✓ Slack") for line in said.splitlines())


@pytest.mark.unit
def test_the_dingtalk_quickstart_runs_every_block_of_its_first_part() -> None:
    first, rest = DINGTALK_QUICKSTART.read_text().split(DINGTALK_CONFIG_PART)
    run, skipped = command_blocks(first)
    assert not skipped and [block.split()[0] for block in run] == ["make", "umask", "finetune-bot", "finetune-bot"]
    assert "DINGTALK_CLIENT_ID=ding…" in run[1] and "DINGTALK_CLIENT_SECRET=…" in run[1]
    assert not command_blocks(rest)[0]  # after it, a config file to write, no command


@pytest.mark.scenario
@pytest.mark.timeout(600)
async def test_the_dingtalk_quickstart_runs_against_a_fake_dingtalk_stream(tmp_path: Path, make_demo: Demo) -> None:
    run, _ = command_blocks(DINGTALK_QUICKSTART.read_text().split(DINGTALK_CONFIG_PART)[0])
    async with FakeDingTalk() as dingtalk:
        blocks = [
            block.replace("DINGTALK_CLIENT_ID=ding…", f"DINGTALK_CLIENT_ID={dingtalk.client_id}").replace(
                "DINGTALK_CLIENT_SECRET=…", f"DINGTALK_CLIENT_SECRET={dingtalk.client_secret}"
            )
            for block in run
        ]

        async def talk() -> None:
            said = group_message("@Finetune Bot help", "staff-1", "cid-group", dingtalk.session_webhook("quick"))
            await dingtalk.push(message_frame(said))
            await dingtalk.wait_until(lambda: bool(dingtalk.session_replies), what="the answer to help")
            [reply] = dingtalk.session_replies
            assert "/finetune help" in str(reply["body"]["markdown"]["text"])

        # DingTalk is the fake: its endpoints are the variables the reader does not set.
        endpoints = {"DINGTALK_OPENAPI_ENDPOINT": dingtalk.url, "DINGTALK_OAPI_ENDPOINT": dingtalk.url}
        said = await run_chat_quickstart(
            tmp_path, make_demo, blocks, endpoints, lambda: dingtalk.wait_connected(timeout=540), talk
        )
    assert any(line.startswith("✓ DingTalk") for line in said.splitlines())

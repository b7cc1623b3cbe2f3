"""What both programs say about themselves: ``--version``, and each command's ``--help``, which lists the
environment variables it reads from the same table the code is held to here (every name the code reads is in
it), names every policy ``simulate`` replays, and is plain text (no reStructuredText markup from a docstring).
"""

from __future__ import annotations

import io
import re
import subprocess
import sys
from collections.abc import Callable
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from bot import cli as bot_cli
from bot.cli_help import ENVIRONMENT
from bot.cloud.aws.region import REGION_VARIABLES
from handlers.spot.rules import SIMULATED_POLICIES
from runner import cli as runner_cli
from runner.environment import RUNNER_ENVIRONMENT
from runner.trainer import TrainerFiles, trainer_environment

ROOT = Path(__file__).resolve().parent.parent
VERSION = (ROOT / "VERSION").read_text().strip()
# reStructuredText a docstring may carry that help must not show: ``literals`` and :role:`targets`.
MARKUP = re.compile(r"``|:(?:func|mod|class|meth|data|attr):`")
ENV_NAME = r"([A-Z][A-Z0-9]*_[A-Z0-9_]+)"


def shown(main: Callable[[list[str]], int], *argv: str) -> str:
    """What ``main(argv)`` prints on stdout before argparse exits with status 0 (help, version)."""
    out = io.StringIO()
    with redirect_stdout(out), pytest.raises(SystemExit) as exited:
        main(list(argv))
    assert exited.value.code == 0
    return out.getvalue()


def bot_commands() -> list[str]:
    """The commands ``finetune-bot --help`` offers, as argparse lists them: ``{serve,demo,…}``."""
    listed = re.search(r"\{([a-z,-]+)\}", shown(bot_cli.main, "--help"))
    assert listed is not None
    return listed.group(1).split(",")


def listed_variables(help_text: str) -> set[str]:
    """The names under the help's ``environment variables:`` heading."""
    _, heading, rest = help_text.partition("environment variables:")
    assert heading, help_text
    return set(re.findall(ENV_NAME, rest))


@pytest.mark.parametrize(
    ("program", "module"),
    [("finetune-bot", "bot.cli"), ("finetune-runner", "runner.cli")],
)
def test_version_is_the_version_file_s(program: str, module: str) -> None:
    result = subprocess.run([sys.executable, "-m", module, "--version"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{program} {VERSION}\n"


def test_every_bot_command_lists_the_variables_of_its_table() -> None:
    commands = bot_commands()
    assert {"serve", "chat", "demo", "simulate"} <= set(commands)
    assert set(commands) == set(ENVIRONMENT), "each command has a row in bot/cli_help.py's ENVIRONMENT"
    for command in commands:
        expected = {name for names in ENVIRONMENT[command]().values() for name in names}
        assert listed_variables(shown(bot_cli.main, command, "--help")) == expected, command
    serve = listed_variables(shown(bot_cli.main, "serve", "--help"))
    assert {"REDIS_URL", "SLACK_BOT_TOKEN", "FINETUNE_CONFIG", "FINETUNE_LOG_LEVEL", "AWS_REGION"} <= serve
    assert listed_variables(shown(bot_cli.main, "chat", "--help")) == serve  # both run the service as configured
    demo = listed_variables(shown(bot_cli.main, "demo", "--help"))
    assert {"FINETUNE_STATE_DIR", "FINETUNE_TRAINER_USER"} <= demo and "FINETUNE_HTTP_PORT" not in demo
    assert "environment variables: none" in shown(bot_cli.main, "simulate", "--help")


def test_the_runner_lists_the_variables_of_its_table() -> None:
    listed = listed_variables(shown(runner_cli.main, "run", "--help"))
    assert listed == {name for names in RUNNER_ENVIRONMENT.values() for name in names}
    assert {"FINETUNE_KEY_FROM", "FINETUNE_S3_PART_MIB", "FINETUNE_TRAINER_USER", "OSS_ENDPOINT"} <= listed


# How the bot's code reads a variable itself (the settings model reads the rest): environ.get("X"), env.get("X"),
# "X" in os.environ, environ["X"] but not environ["X"] = ….
BOT_READS = [
    re.compile(rf"""\b(?:environ|env)\.get\(\s*["']{ENV_NAME}["']"""),
    re.compile(rf"""["']{ENV_NAME}["']\s+(?:not\s+)?in\s+(?:os\.)?environ\b"""),
    re.compile(rf"""\benviron\[\s*["']{ENV_NAME}["']\s*\](?!\s*=[^=])"""),
]


def test_every_variable_the_bot_reads_is_in_the_table() -> None:
    read: dict[str, str] = {}
    for path in sorted((ROOT / "bot").rglob("*.py")):
        text = path.read_text()
        for pattern in BOT_READS:
            for name in pattern.findall(text):
                read.setdefault(name, str(path.relative_to(ROOT)))
    assert {"FINETUNE_LOG_LEVEL", "ALIBABA_CLOUD_ACCESS_KEY_ID"} <= set(read)  # the scan finds reads
    tabled = {name for groups in ENVIRONMENT.values() for names in groups().values() for name in names}
    assert set(REGION_VARIABLES) <= tabled  # read in a loop, which the scan does not see
    assert {name: where for name, where in read.items() if name not in tabled} == {}


def test_the_runner_table_is_what_the_runner_reads(tmp_path: Path) -> None:
    """Every variable of the runner's own (FINETUNE_*) or its clouds' (AWS_*, OSS_*, ALIBABA_CLOUD_*) the runner's
    side of the package names (the trainer's, runner.hf and runner.swift, aside) is in the table, but for those it
    sets for its trainer; and every name in the table is in the code. (Other names it only passes on to the
    trainer: runner.trainer_env.)"""
    own = re.compile(r"""["']((?:FINETUNE|AWS|OSS|ALIBABA_CLOUD)_[A-Z0-9_]+)["']""")
    names: set[str] = set()
    for path in (ROOT / "runner").rglob("*.py"):
        if path.parent.name not in ("hf", "swift") and path.name != "environment.py":
            names |= set(own.findall(path.read_text()))
    _, contract = trainer_environment({}, TrainerFiles.under(tmp_path), None)
    assert "FINETUNE_OUTPUT_DIR" in contract
    tabled = {name for group in RUNNER_ENVIRONMENT.values() for name in group}
    assert names - set(contract) == tabled


def help_texts() -> dict[str, str]:
    texts = {"finetune-bot": shown(bot_cli.main, "--help"), "finetune-runner": shown(runner_cli.main, "--help")}
    for command in bot_commands():
        texts[f"finetune-bot {command}"] = shown(bot_cli.main, command, "--help")
    texts["finetune-runner run"] = shown(runner_cli.main, "run", "--help")
    return texts


def test_no_help_shows_markup() -> None:
    texts = help_texts()
    assert len(texts) >= 7
    assert {name: text for name, text in texts.items() if MARKUP.search(text)} == {}
    assert MARKUP.search("``finetune-runner run``")  # the pattern sees what it looks for


def test_simulate_s_help_names_every_policy_it_replays_as_its_error_does(capsys: pytest.CaptureFixture[str]) -> None:
    text = shown(bot_cli.main, "simulate", "--help")
    (line,) = [line for line in text.splitlines() if line.startswith("policies: ")]
    named = [name.removesuffix(" (the default)") for name in line.removeprefix("policies: ").split(", ")]
    assert named == list(SIMULATED_POLICIES)
    capsys.readouterr()
    assert bot_cli.main(["simulate", "--policy", "no-such-policy"]) == 2
    error = capsys.readouterr().err
    assert error.endswith(f"the policies are {', '.join(named)}\n"), error

"""What ``finetune-bot``'s help says besides the arguments: the version and, for each command, what it does and
the environment variables it reads, from one table (the settings model's fields and the few names the code reads
itself; tests/test_cli_help.py holds the code to it).

Both are made only when asked for: the settings model takes half a second to import, and ``simulate`` starts
many times a run without ever showing its help.
"""

from __future__ import annotations

import argparse
import textwrap
from collections.abc import Callable, Sequence
from typing import Any

DISTRIBUTION = "finetune-chatops"

# Read by the code itself rather than through the settings model.
LOGGING = ("FINETUNE_LOG_LEVEL",)
CLOUD_SDKS = (
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "ALIBABA_CLOUD_ACCESS_KEY_ID",
    "ALIBABA_CLOUD_ACCESS_KEY_SECRET",
    "ALIBABA_CLOUD_SECURITY_TOKEN",
    "ALIBABA_CLOUD_METADATA_ENDPOINT",
)
DEMO_OWN = ("FINETUNE_STATE_DIR", "FINETUNE_TRAINER_USER", "FINETUNE_LOG_LEVEL")
# The settings the demo sets itself: its own state dir under FINETUNE_STATE_DIR, a free port, its grace.
DEMO_CHOSEN = ("FINETUNE_STATE_DIR", "FINETUNE_HTTP_PORT", "FINETUNE_LOCAL_GRACE_SECONDS")

Groups = dict[str, tuple[str, ...]]


def settings_variables() -> tuple[str, ...]:
    """The variables the settings model reads: one per field, its name in capitals (pydantic-settings' rule)."""
    from bot.settings import Settings

    return tuple(name.upper() for name in Settings.model_fields)


def _service() -> Groups:
    return {"settings": settings_variables(), "logging": LOGGING, "the clouds": CLOUD_SDKS}


def _demo() -> Groups:
    settings = tuple(name for name in settings_variables() if name not in DEMO_CHOSEN)
    return {"the demo": DEMO_OWN, "settings (but those the demo sets itself)": settings, "the clouds": CLOUD_SDKS}


ENVIRONMENT: dict[str, Callable[[], Groups]] = {
    "serve": _service,
    "chat": _service,
    "check": _service,
    "demo": _demo,
    "simulate": dict,
}


# Each command: its name, its line in the list of commands, and the start of its own help.
COMMANDS = (
    (
        "serve",
        "run the bot with every configured adapter until SIGTERM",
        "Run the bot with every configured chat adapter, cloud and event source until SIGTERM or SIGINT, then stop\n"
        "cleanly. Configured by the environment variables below and the YAML file FINETUNE_CONFIG names.\n"
        "Exit status: 0 after a clean stop; 1 when a part of the service ended by itself or Redis cannot be\n"
        "reached; 2 for a bad setting (one line on stderr).",
    ),
    (
        "demo",
        "interrupt and recover a tiny fine-tune on this machine, end to end",
        "Start a tiny fine-tune on a local spot instance, interrupt it with a spot notice, and watch the bot resume\n"
        "it from its last checkpoint: a checklist of what happened, exit status 0 when every step passed\n"
        "(SIGTERM or Ctrl-C stops it cleanly, status 128 + the signal's number).",
    ),
    (
        "chat",
        "a console chat against the bot's handlers",
        "A terminal chat with the bot: type the chat commands (help lists them), see its messages.\n"
        "Ctrl-D, Ctrl-C or SIGTERM ends it; the bot's log goes to bot.log in the state dir.",
    ),
    (
        "check",
        "check the set-up before the first job: one line per check, exit 0 when all pass, else 1",
        "Check the set-up before the first job: the configuration, Redis, the cloud's credentials, region and what\n"
        "the bot may do there (dry runs), the bucket, the event sources, the chat tokens and their scopes. One line\n"
        "per check, a tick or a cross with what is wrong and the fix. Exit status: 0 when every check passes, 1\n"
        "otherwise, 2 for a bad setting (one line on stderr).",
    ),
    (
        "simulate",
        "replay the bot's spot policies on spot traces (JSON Lines scenarios on stdin, results on stdout)",
        "Replay the bot's spot policies on spot traces: a JSON Lines scenario per line on stdin, a result line\n"
        "per scenario and policy on stdout. Bad input is one line on stderr and exit status 2.",
    ),
)


def command_epilog(command: str) -> str:
    """The end of ``command``'s help: the policies ``simulate`` knows, the variables every command reads."""
    text = environment_help(ENVIRONMENT[command]())
    if command == "simulate":
        from handlers.spot.rules import DEFAULT_POLICY, SIMULATED_POLICIES

        names = [f"{name} (the default)" if name == DEFAULT_POLICY else name for name in SIMULATED_POLICIES]
        text = f"policies: {', '.join(names)}\n\n{text}"
    return text


def environment_help(groups: Groups, width: int = 100) -> str:
    """The groups as help text: a heading, then each group's names wrapped under its title."""
    if not groups:
        return "environment variables: none"
    lines = ["environment variables:"]
    for title, names in groups.items():
        lines += textwrap.wrap(
            " ".join(names), width, initial_indent=f"  {title}: ", subsequent_indent="    ", break_on_hyphens=False
        )
    return "\n".join(lines)


class HelpParser(argparse.ArgumentParser):
    """A parser whose epilog is written when its help is shown (``epilog_from``): the list of a command's variables
    needs the settings model, which most runs never import."""

    def __init__(self, *args: Any, epilog_from: Callable[[], str] | None = None, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(*args, **kwargs)
        self.epilog_from = epilog_from

    def format_help(self) -> str:
        if self.epilog_from is not None:
            self.epilog = self.epilog_from()
        return super().format_help()


class ShowVersion(argparse.Action):
    """``--version``: the installed distribution's version (the one in VERSION), looked up only when asked."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help="print the version and exit")

    def __call__(self, parser: argparse.ArgumentParser, *args: Any) -> None:
        print(f"{parser.prog} {installed_version()}")
        parser.exit()


def installed_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "(not installed: no version)"

"""What ``finetune-bot``'s help says besides the arguments: the version and, for each command, the environment
variables it reads, from one table (the settings model's fields and the few names the code reads itself;
tests/test_cli_help.py holds the code to it).

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
    "demo": _demo,
    "simulate": dict,
}


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

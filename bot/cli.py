"""``finetune-bot``: ``serve`` runs the bot, ``demo`` plays the local story, ``chat`` is a console chat,
``simulate`` replays the bot's spot policies on spot traces, ``check`` says whether the set-up is ready.

Whatever is wrong with the setup (a bad variable, an unreadable config file, a port in use, another bot on the
same state dir) is one line on stderr and exit status 2, never a traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import pwd
import signal
import sys
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from bot.cli_help import COMMANDS, HelpParser, ShowVersion, command_epilog
from bot.errors import ConfigError, StoreUnavailable

if TYPE_CHECKING:
    from bot.checks.result import Check
    from bot.service import BotService
    from bot.settings import Settings
    from handlers.jobs import ChatRef

# The service (aiohttp, Redis, the clouds' SDKs, the chat adapters) is imported by the commands that run it, not
# at the top: `simulate` needs none of it, and the tests start `finetune-bot simulate` many times.

log = logging.getLogger("bot")

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


async def serve(settings: Settings) -> int:
    """Run until SIGTERM or SIGINT, then stop cleanly (the handler in flight finishes or is left pending); 1 when
    one of the service's loops ended by itself (bot/supervision.py)."""
    from bot.service import BotService

    checks = await _start_checks(settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    async with BotService(settings) as service:
        _log_checks(checks)  # once up: a start refused for any reason stays one line
        gc.freeze()  # what starting made lives as long as the process: kept out of every collection, the last included
        print(f"finetune-bot serving on port {service.port}", flush=True)
        stopped, failed = asyncio.create_task(stop.wait()), asyncio.create_task(service.loops.failed.wait())
        await asyncio.wait([stopped, failed], return_when=asyncio.FIRST_COMPLETED)
        stopped.cancel()
        failed.cancel()
        if service.loops.failed.is_set():  # a dead part of a live replica: exit so that the platform replaces it
            log.critical("stopping: a service loop ended (%s)", service.loops.cause)
            return 1
        log.info("stopping")
    return 0


async def _start_checks(settings: Settings) -> list[Check]:
    """``check``'s cloud and event-source checks (bot/checks/run.py); ConfigError (one line, exit 2) on a cloud
    without credentials, a region or an event source."""
    from bot.checks.report import start_refusal
    from bot.checks.run import start_checks

    checks = await start_checks(settings)
    refusal = start_refusal(checks, settings.finetune_cloud)
    if refusal is not None:
        raise ConfigError(refusal)
    return checks


def _log_checks(checks: list[Check]) -> None:
    """Each check in the log: a failure that does not stop the start (a missing bucket, scope…) as a warning."""
    from bot.checks.report import line

    for found in checks:
        (log.info if found.ok else log.warning)("check %s", line(found))


async def check(settings: Settings) -> int:
    """One line per check, ``✓`` or ``✗`` with the fix; 0 when all pass, else 1."""
    from bot.checks.report import exit_status, line
    from bot.checks.run import check_all

    checks = await check_all(settings)
    for found in checks:
        print(line(found), flush=True)
    return exit_status(checks)


async def chat(settings: Settings, log_file: Path) -> int:
    """A terminal chat against the same handlers: type ``/finetune`` commands, see the bot's messages.

    Ctrl-D or Ctrl-C (at the prompt or while a command runs) and SIGTERM all end it the same clean way.
    """
    from bot.chat.console import ConsoleChat
    from bot.cloud.local.provider import LocalCloud
    from bot.service import BotService
    from handlers.jobs import ChatRef

    user = f"console:{console_user()}"
    channel = ChatRef(platform="console", channel="terminal")
    async with BotService(settings, ConsoleChat(), admins=[user]) as service:  # an admin of its own console
        gc.freeze()
        print(f"finetune-bot chat as {user} — type 'help', Ctrl-D to quit (bot log: {log_file})", flush=True)
        if isinstance(service.bot.cloud, LocalCloud) and service.bot.cloud.trainer_note:
            print(f"({service.bot.cloud.trainer_note})", flush=True)
        session = asyncio.create_task(_converse(service, user, channel))
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):  # SIGINT arrives while a command runs (no prompt then)
            loop.add_signal_handler(signum, session.cancel)
        with contextlib.suppress(asyncio.CancelledError):
            await session
        print(await _leaving(service), flush=True)
    return 0


def console_user() -> str:
    """Who is at the console: the process's own uid, by its account name (its number where it has none). Not
    ``$USER`` / ``$LOGNAME``: anyone can set those (``USER=alice finetune-bot chat``), and the console would act
    with alice's permissions."""
    uid = os.getuid()
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:  # a uid with no account (a container's arbitrary user)
        return str(uid)


async def _converse(service: BotService, user: str, channel: ChatRef) -> None:
    from bot.chat.console import read_commands, terminal_text

    async for line in read_commands():
        print(terminal_text(await service.bot.command(user, channel, line)), flush=True)


async def _leaving(service: BotService) -> str:
    """What happens to the jobs when this bot goes: said once, on the way out."""
    from bot.cloud.local.provider import LocalCloud
    from handlers.jobs import ACTIVE_STATES

    active = [job.id for job in await service.bot.store.list_jobs(ACTIVE_STATES)]
    if not active:
        return "Bye."
    if isinstance(service.bot.cloud, LocalCloud):
        if service.settings.redis_url:  # the instances' control plane is not this bot's: they carry on
            return f"Bye. The local instances of {', '.join(active)} keep running; the next bot on this Redis goes on."
        # They outlive a bot, but not its embedded Redis: without it they take themselves down within a minute.
        return (
            f"Bye. The local instances of {', '.join(active)} stop within a minute of this bot; their committed "
            "checkpoints are kept: next time, `stop <job>` then `resume <job>` continues one."
        )
    return f"Bye. {', '.join(active)} keep running on {service.bot.cloud.name}; the next bot carries on with them."


def _log_to(command: str, settings: Settings) -> Path | None:
    """Logging set up for ``command``: ``serve`` on stderr; ``chat`` into a file in the state dir (the terminal
    is the chat), whose path is returned. ConfigError for a bad FINETUNE_LOG_LEVEL."""
    level = os.environ.get("FINETUNE_LOG_LEVEL") or ("INFO" if command in ("serve", "chat") else "WARNING")
    if level.upper() not in logging.getLevelNamesMapping():
        raise ConfigError(f"FINETUNE_LOG_LEVEL={level!r}: must be one of DEBUG, INFO, WARNING, ERROR, CRITICAL")
    # The AWS SDK's INFO lines (where it found credentials, an endpoint) are chatter: the checks at start say what
    # matters, and a refused start stays one line.
    for name in ("botocore", "aiobotocore"):
        logging.getLogger(name).setLevel(logging.WARNING)
    if command != "chat":
        logging.basicConfig(level=level.upper(), format=LOG_FORMAT)
        return None
    path = settings.finetune_state_dir / "bot.log"
    try:
        settings.finetune_state_dir.mkdir(parents=True, exist_ok=True)
        logging.basicConfig(level=level.upper(), format=LOG_FORMAT, filename=path)
    except OSError as exc:
        raise ConfigError(f"FINETUNE_STATE_DIR={settings.finetune_state_dir} cannot be used: {exc.strerror}") from None
    return path


def main(argv: list[str] | None = None) -> int:
    parser = HelpParser(
        prog="finetune-bot",
        description="ChatOps for fine-tunes on spot GPUs",
        epilog="finetune-bot COMMAND --help says what the command does and which environment variables it reads.",
    )
    parser.add_argument("--version", action=ShowVersion)
    commands = parser.add_subparsers(dest="command", required=True)
    for name, summary, description in COMMANDS:
        commands.add_parser(name, help=summary, description=description, epilog_from=partial(command_epilog, name))
    commands.choices["simulate"].add_argument(
        "--policy", action="append", metavar="NAME", help="a policy to replay (listed below); repeat for several"
    )
    args = parser.parse_args(argv)
    if args.command == "simulate":
        from bot.simulate import main as simulate_main

        return simulate_main(args.policy)
    if args.command == "demo":
        from bot.demo import main as demo

        return demo()
    try:
        from bot.settings import load_settings

        settings = load_settings()
        if args.command == "chat" and "finetune_http_port" not in settings.model_fields_set:
            # A console beside a running `serve` must not fight it for the port: take one the system gives.
            settings = settings.model_copy(update={"finetune_http_port": 0})
        log_file = _log_to(args.command, settings)
        if args.command == "serve":
            return asyncio.run(serve(settings))
        if args.command == "check":
            return asyncio.run(check(settings))
        assert log_file is not None
        return asyncio.run(chat(settings, log_file))
    except ConfigError as exc:
        for line in str(exc).splitlines():
            print(f"finetune-bot: {line}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C before the bot was up (once up, it is a clean stop instead)
        return 130
    except StoreUnavailable as exc:  # not 2: a server that is down now may be up when the supervisor retries
        print(f"finetune-bot: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

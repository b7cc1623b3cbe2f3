"""``finetune-bot``: ``serve`` runs the bot, ``demo`` plays the local story, ``chat`` is a console chat,
``simulate`` replays the bot's spot policies on spot traces."""

from __future__ import annotations

import argparse
import asyncio
import getpass
import logging
import os
import signal
import sys

from bot.chat.console import ConsoleChat
from bot.service import BotService
from bot.settings import ConfigError, Settings
from handlers.jobs import ChatRef

log = logging.getLogger("bot")


async def serve(settings: Settings) -> int:
    """Run until SIGTERM or SIGINT, then stop cleanly (the handler in flight finishes or is left pending)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    async with BotService(settings) as service:
        print(f"finetune-bot serving on port {service.port}", flush=True)
        await stop.wait()
        log.info("stopping")
    return 0


async def chat(settings: Settings) -> int:
    """A terminal chat against the same handlers: type ``/finetune`` commands, see the bot's messages."""
    user = f"console:{getpass.getuser()}"
    channel = ChatRef(platform="console", channel="terminal")
    async with BotService(settings, ConsoleChat()) as service:
        print(f"finetune-bot chat as {user} — type 'help', Ctrl-D to quit", flush=True)
        while True:
            try:
                line = await asyncio.to_thread(input, "/finetune ")
            except EOFError:
                return 0
            if line.strip():
                print(await service.bot.command(user, channel, line), flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="finetune-bot", description="ChatOps for fine-tunes on spot GPUs")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("serve", help="run the bot with every configured adapter until SIGTERM")
    commands.add_parser("demo", help="interrupt and recover a tiny fine-tune on this machine, end to end")
    commands.add_parser("chat", help="a console chat against the bot's handlers")
    simulate = commands.add_parser(
        "simulate",
        help="replay the bot's spot policies on spot traces (JSON Lines scenarios on stdin, results on stdout)",
    )
    simulate.add_argument(
        "--policy",
        action="append",
        metavar="NAME",
        help="deadline-aware (the default), greedy, on-demand or spot-only; repeat for several",
    )
    args = parser.parse_args(argv)
    if args.command == "simulate":
        from bot.simulate import main as simulate_main

        return simulate_main(args.policy)
    if args.command == "demo":
        from bot.demo import main as demo

        return demo()
    logging.basicConfig(
        level=os.environ.get("FINETUNE_LOG_LEVEL", "INFO" if args.command == "serve" else "WARNING"),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        settings = Settings()
        return asyncio.run(serve(settings) if args.command == "serve" else chat(settings))
    except ConfigError as exc:
        print(f"finetune-bot: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

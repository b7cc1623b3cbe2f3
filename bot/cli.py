"""``finetune-bot``: the bot's command line.

``demo`` plays a spot interruption and recovery on this machine with the real runner and trainer.
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="finetune-bot", description="ChatOps for fine-tunes on spot GPUs")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("demo", help="interrupt and recover a tiny fine-tune on this machine")
    args = parser.parse_args(argv)
    if args.command == "demo":
        from bot.demo import main as demo

        return demo()
    parser.error(f"unknown command {args.command}")
    return 2


if __name__ == "__main__":
    sys.exit(main())

"""A bot in a process of its own, for tests that kill it: ``python -m tests.bot_process STATE_DIR CONFIG RECIPE``.

It starts the real service (embedded Valkey unless ``REDIS_URL`` is set, the local cloud), starts one job of
``RECIPE`` from the console, prints one JSON line (``job``, ``redis``: the Redis it uses) and runs until killed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from pathlib import Path

from bot.chat.console import ConsoleChat
from bot.service import BotService
from bot.settings import Settings
from fakes.bot_harness import CHANNEL, SECRET


async def main(state_dir: Path, config: Path, recipe: str) -> None:
    settings = Settings(
        finetune_state_dir=state_dir,
        finetune_http_port=0,
        finetune_config=config,
        finetune_report_secret=SECRET,
        finetune_local_grace_seconds=20.0,
    )
    service = await BotService(settings, ConsoleChat(write=lambda line: print(line, file=sys.stderr))).start()
    reply = await service.bot.command("console:ana", CHANNEL, f"start {recipe}")
    if not reply.startswith("Starting ft-"):
        raise SystemExit(f"the job did not start: {reply}")
    print(json.dumps({"job": reply.split()[1].rstrip(":"), "redis": service.redis_url}), flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    asyncio.run(main(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]))

"""``python -m bot.healthcheck``: exit 0 when the bot on this host answers ``/healthz`` (so Redis answers it), else 1.

For container health checks (the Dockerfile's HEALTHCHECK, ECS's task definition): the slim image has no curl,
and this uses the standard library only, so a check costs a Python start and one request.
"""

from __future__ import annotations

import os
import sys
import urllib.request

ANY_ADDRESS = {"", "0.0.0.0", "::"}


def health_url(environ: dict[str, str] | None = None) -> str:
    """Where this host's bot listens, from the same variables the bot reads."""
    env = dict(os.environ) if environ is None else environ
    host = env.get("FINETUNE_HTTP_HOST", "127.0.0.1").strip()
    host = "127.0.0.1" if host in ANY_ADDRESS else host
    host = f"[{host}]" if ":" in host else host
    return f"http://{host}:{env.get('FINETUNE_HTTP_PORT', '8080').strip()}/healthz"


def main() -> int:
    url = health_url()
    try:
        with urllib.request.urlopen(url, timeout=4) as response:
            return 0 if response.status == 200 else 1
    except (OSError, ValueError) as exc:
        print(f"finetune-bot healthcheck: {url}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

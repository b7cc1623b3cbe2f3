"""The boot script every cloud instance gets: point the runner's systemd unit at this attempt's spec, start it.

It installs nothing: the image carries the runner (``deploy/image/install.sh runner`` puts it under
``/opt/finetune`` with ``deploy/systemd/finetune-runner.service``, which reads ``/etc/finetune-runner.env``), and an
image without it fails here, loudly, in the console output. No secret belongs here: user data is readable from the
instance's metadata service by any process on it, and by whoever may describe the instance (the attempt's report
key travels in its spec object). The environment file is root's alone all the same (made 0600 before anything is
written to it, even where the image already had one), and the runner checks that before a trainer starts.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from handlers.spec import RUNNER_ENV_FILE

RUNNER_UNIT = "finetune-runner.service"
_SAFE_PATH = re.compile(r"^/[A-Za-z0-9._/-]*$")
_ENV_NAME = re.compile(r"^[A-Z][A-Z0-9_]*$")
_ENV_VALUE = re.compile(r"^[A-Za-z0-9._:/@%+=,~!^&*?()\[\]{}|<>;-]*$")  # no quote, backslash, $, space, #


def plain_path(value: str) -> str:
    """A settings validator for the runner's paths on the instance: they go into the boot script as they are."""
    if not _SAFE_PATH.fullmatch(value):
        raise ValueError("must be an absolute path of letters, digits and . _ / -")
    return value


def runner_boot_script(env: Mapping[str, str], runner_path: str) -> str:
    """The script; ValueError for a path or an environment entry that could break out of the heredoc."""
    if not _SAFE_PATH.fullmatch(runner_path):
        raise ValueError(f"runner path {runner_path!r} must be an absolute path of letters, digits and . _ / -")
    for name, value in env.items():
        if not _ENV_NAME.fullmatch(name) or not _ENV_VALUE.fullmatch(value):
            raise ValueError(f"environment entry {name} has characters a boot script must not carry")
    runner = f"{runner_path}/bin/finetune-runner"
    lines = [
        "#!/bin/bash",
        "# finetune-chatops: start the runner baked into the image on this attempt's spec.",
        "set -euo pipefail",
        f"if [ ! -x '{runner}' ]; then",
        f"  echo 'finetune-chatops: {runner} is missing: launch an image with the runner installed' >&2",
        "  exit 1",
        "fi",
        "umask 077",
        f"install -m 0600 -o root -g root /dev/null {RUNNER_ENV_FILE}",
        f"cat > {RUNNER_ENV_FILE} <<'ENV'",
        *(f"{name}={value}" for name, value in env.items()),
        "ENV",
        "systemctl daemon-reload",
        f"systemctl enable --now {RUNNER_UNIT}",
        "",
    ]
    return "\n".join(lines)

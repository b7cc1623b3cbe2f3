"""Where an instance keeps the runner's own files: named once, for the bot's boot script and the runner's check."""

from __future__ import annotations

# The runner's environment, written by the boot script, read by its systemd unit: on Alibaba it holds the
# attempt's report key, so it is root's alone (``runner.own_paths`` checks it before a trainer starts).
RUNNER_ENV_FILE = "/etc/finetune-runner.env"

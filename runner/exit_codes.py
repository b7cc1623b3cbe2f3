"""The runner's exit codes (documented in docs/runner.md): the bot and systemd units read them."""

EXIT_COMPLETED = 0
EXIT_FAILED = 1
EXIT_BAD_SPEC = 2
EXIT_NO_REPORT_KEY = 3  # AWS: no key object for this instance in time; nothing started, nothing reported
EXIT_NO_METADATA_GUARD = 4  # the trainer's user could reach the metadata service: not started, reported failed
EXIT_INTERRUPTED = 75  # EX_TEMPFAIL: this attempt ended early on purpose; the job goes on elsewhere

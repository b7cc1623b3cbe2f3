"""What the Slack app must be granted: the OAuth scope of each Web API method the bot calls.

One table, so that the app manifests in deploy/slack/ ask for what the code uses and no more:
tests/test_slack_manifest.py finds every Web API method the bot's Slack modules call (through slack_sdk, including
what a helper such as ``files_upload_v2`` calls underneath) and fails on one missing here, and holds both manifests
to exactly :data:`BOT_SCOPES`. A method the bot starts calling therefore needs its scope here and in the manifests
before the suite passes, not after a workspace refuses it with ``missing_scope``. ``finetune-bot check`` compares
them with what Slack says the token has (the ``x-oauth-scopes`` header of every Web API answer) and says what each
missing one costs.
"""

from __future__ import annotations

from typing import Final

# Bot token (xoxb-...): each method -> the scopes it needs. Some methods need one scope per kind of conversation;
# the bot posts in public and private channels (not in DMs), so both channel kinds' scopes are listed.
BOT_METHOD_SCOPES: Final[dict[str, frozenset[str]]] = {
    "auth.test": frozenset(),  # any token: who the bot is, at start
    "chat.postMessage": frozenset({"chat:write"}),  # cards, thread notes, alerts, pages
    "chat.update": frozenset({"chat:write"}),  # the card edited in place; pages marked acknowledged
    "chat.postEphemeral": frozenset({"chat:write"}),  # a slow command's answer, to the caller only
    # A note in doubt (a replica died mid-post, Slack timed out) is looked for before it is posted again.
    "conversations.history": frozenset({"channels:history", "groups:history"}),
    "conversations.replies": frozenset({"channels:history", "groups:history"}),
    # A job's chart and a costs report's chart (files_upload_v2).
    "files.getUploadURLExternal": frozenset({"files:write"}),
    "files.completeUploadExternal": frozenset({"files:write"}),
}
# App-level token (xapp-..., Socket Mode only): made on the app's Basic Information page, not in the manifest.
APP_METHOD_SCOPES: Final[dict[str, frozenset[str]]] = {
    "apps.connections.open": frozenset({"connections:write"}),
}
# Scopes of a feature rather than of a method: the slash command.
FEATURE_SCOPES: Final[frozenset[str]] = frozenset({"commands"})

BOT_SCOPES: Final[frozenset[str]] = frozenset().union(*BOT_METHOD_SCOPES.values()) | FEATURE_SCOPES

# What each scope is for, as ``finetune-bot check`` words a missing one (tests/test_slack_manifest.py holds the two to
# exactly BOT_SCOPES). Without these the bot cannot work in Slack at all:
NEEDED: Final[dict[str, str]] = {
    "chat:write": "posting and updating job cards and notes",
    "commands": "the slash command",
}
# Without these it works, with less: each says what goes missing.
WANTED: Final[dict[str, str]] = {
    "channels:history": "a note re-sent after a crash may show twice in a public channel",
    "groups:history": "a note re-sent after a crash may show twice in a private channel",
    "files:write": "a job's chart is not uploaded into its thread",
}

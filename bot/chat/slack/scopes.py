"""The bot token scopes the bot uses, and what each is for: ``finetune-bot check`` compares them with what Slack says
the token has (the ``x-oauth-scopes`` header of every Web API answer)."""

from __future__ import annotations

# Without these the bot cannot work in Slack at all.
NEEDED = {
    "chat:write": "posting and updating job cards and notes",
    "commands": "the slash command",
}
# Without these it works, with less: each says what goes missing.
WANTED = {
    "channels:history": "a note re-sent after a crash may show twice in a public channel",
    "groups:history": "a note re-sent after a crash may show twice in a private channel",
    "files:write": "a job's chart is not uploaded into its thread",
}

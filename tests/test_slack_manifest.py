"""The Slack app manifests in deploy/slack/ ask for what the code uses: its slash command, its routes, its scopes.

The Web API methods the bot calls are found in its source (every call of a slack_sdk client method, followed
through slack_sdk's own source to the methods it sends, so ``files_upload_v2`` counts as the two upload calls it
makes); each must have its scopes in bot/chat/slack/scopes.py, and both manifests must ask for exactly those scopes.
So a new call whose scope is missing fails here, and so does a scope no code needs any more. The HTTP manifest's
URLs name the route the bot serves Slack on; the Socket Mode one names none.
"""

from __future__ import annotations

import ast
import functools
import inspect
import re
from pathlib import Path
from typing import Any, cast
from urllib.parse import urlsplit

import pytest
import yaml
from slack_sdk.web.async_client import AsyncWebClient

from bot.chat.slack.app import events_route
from bot.chat.slack.config import SlackConfig
from bot.chat.slack.scopes import APP_METHOD_SCOPES, BOT_METHOD_SCOPES, BOT_SCOPES, NEEDED, WANTED
from bot.public_routes import PUBLIC_ROUTES

ROOT = Path(__file__).resolve().parent.parent
MANIFESTS = {"http": ROOT / "deploy/slack/manifest.yaml", "socket": ROOT / "deploy/slack/manifest-socket.yaml"}
PLACEHOLDER_HOST = "finetune.example.com"
_API_CALL = re.compile(r"""api_call\(\s*["']([A-Za-z.]+)["']""")
_SELF_CALL = re.compile(r"\bself\.([A-Za-z_0-9]+)\(")
# What a bolt app can listen to; each kind needs its own part of the manifest (slash_commands, interactivity,
# event_subscriptions...).
BOLT_LISTENERS = {
    "command",
    "action",
    "block_action",
    "event",
    "message",
    "shortcut",
    "global_shortcut",
    "message_shortcut",
    "view",
    "view_submission",
    "view_closed",
    "options",
    "function",
}


def manifest(kind: str) -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load(MANIFESTS[kind].read_text())
    return document


@functools.cache
def web_api_methods(sdk_method: str) -> frozenset[str]:
    """The Web API methods slack_sdk's ``AsyncWebClient.<sdk_method>`` sends (none: not a Web API method)."""
    source = inspect.getsource(getattr(AsyncWebClient, sdk_method))
    sent = set(_API_CALL.findall(source))
    for called in set(_SELF_CALL.findall(source)) - {sdk_method, "api_call"}:
        if callable(getattr(AsyncWebClient, called, None)) and not called.startswith("__"):
            sent |= web_api_methods(called)
    return frozenset(sent)


def sdk_client_methods() -> set[str]:
    return {
        name for name in dir(AsyncWebClient) if not name.startswith("_") and callable(getattr(AsyncWebClient, name))
    }


def calls_in(source: str) -> list[tuple[int, str]]:
    """(line, attribute) of each ``<something>.<attribute>(...)`` call in ``source``."""
    return [
        (node.lineno, node.func.attr)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
    ]


def bot_modules() -> list[Path]:
    return sorted((ROOT / "bot").rglob("*.py"))


def methods_called() -> dict[str, list[str]]:
    """Each Web API method the bot's source calls -> where (file:line)."""
    client_methods = sdk_client_methods()
    found: dict[str, list[str]] = {}
    for path in bot_modules():
        source = path.read_text()
        for line, attribute in calls_in(source):
            where = f"{path.relative_to(ROOT)}:{line}"
            if attribute == "api_call":
                named = _API_CALL.search(source.splitlines()[line - 1])
                assert named is not None, f"{where}: api_call with a method name this test cannot read"
                sent = {named.group(1)}
            elif attribute in client_methods:
                sent = set(web_api_methods(attribute))
            else:
                continue
            for method in sent:
                found.setdefault(method, []).append(where)
    return found


def test_every_web_api_method_the_bot_calls_has_its_scopes_listed_and_no_other() -> None:
    called = methods_called()
    # The scan sees the adapter's calls, the ones files_upload_v2 makes underneath included.
    assert {"chat.postMessage", "files.getUploadURLExternal", "files.completeUploadExternal"} <= set(called)
    listed = set(BOT_METHOD_SCOPES) | set(APP_METHOD_SCOPES)
    unlisted = {method: called[method] for method in set(called) - listed}
    assert not unlisted, f"add each method's scopes to bot/chat/slack/scopes.py and deploy/slack/: {unlisted}"
    assert listed <= set(called), f"listed but never called (drop them): {sorted(listed - set(called))}"
    assert not set(BOT_METHOD_SCOPES) & set(APP_METHOD_SCOPES)


def test_the_scan_follows_slack_sdk_to_the_methods_it_sends() -> None:
    assert web_api_methods("chat_update") == {"chat.update"}
    assert web_api_methods("files_upload_v2") == {"files.getUploadURLExternal", "files.completeUploadExternal"}
    source = "async def f(client):\n    await client.reactions_add(channel='C1', name='x', timestamp='1')\n"
    assert [web_api_methods(name) for _, name in calls_in(source) if name in sdk_client_methods()] == [
        {"reactions.add"}
    ]


@pytest.mark.parametrize("kind", sorted(MANIFESTS))
def test_the_manifest_asks_for_exactly_the_scopes_the_code_needs(kind: str) -> None:
    scopes = manifest(kind)["oauth_config"]["scopes"]
    assert set(scopes) == {"bot"}  # no user token: the bot acts as itself only
    asked = scopes["bot"]
    assert len(asked) == len(set(asked))
    missing, extra = sorted(BOT_SCOPES - set(asked)), sorted(set(asked) - BOT_SCOPES)
    assert not missing and not extra, f"{MANIFESTS[kind].name}: missing {missing}, extra {extra}"


def test_check_words_every_scope_the_code_needs_and_no_other() -> None:
    """``finetune-bot check`` says what each missing scope costs: every scope of the table, each once."""
    assert not set(NEEDED) & set(WANTED)
    assert set(NEEDED) | set(WANTED) == BOT_SCOPES


def bolt_listeners() -> set[str]:
    """The kinds of request the bot's bolt app listens to (``app.command(...)``, ``app.action(...)``...)."""
    kinds: set[str] = set()
    for path in bot_modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "app"
                and node.func.attr in BOLT_LISTENERS
            ):
                kinds.add(node.func.attr)
    return kinds


@pytest.mark.parametrize("kind", sorted(MANIFESTS))
def test_the_manifest_has_the_slash_command_and_the_buttons_and_nothing_else(kind: str) -> None:
    assert bolt_listeners() == {"command", "action"}, "a new kind of listener: give it its part of both manifests"
    document = manifest(kind)
    (command,) = document["features"]["slash_commands"]
    assert command["command"] == SlackConfig.model_fields["command"].default == "/finetune"
    assert command["should_escape"] is False  # the commands take the words as typed (parse in handlers/commands.py)
    assert document["features"]["bot_user"]["display_name"]
    settings = document["settings"]
    assert settings["interactivity"]["is_enabled"] is True  # the cards' and pages' buttons
    assert "event_subscriptions" not in settings  # the bot listens to no event (Slack would verify a URL for one)
    assert settings["org_deploy_enabled"] is False and settings["token_rotation_enabled"] is False


def urls(node: Any, path: str = "") -> dict[str, str]:
    """Every URL in a manifest, by where it is."""
    if isinstance(node, dict):
        return {where: url for key, value in node.items() for where, url in urls(value, f"{path}.{key}").items()}
    if isinstance(node, list):
        return {where: url for index, item in enumerate(node) for where, url in urls(item, f"{path}[{index}]").items()}
    return {path: node} if isinstance(node, str) and "://" in node else {}


def test_the_http_manifest_sends_everything_to_the_route_the_bot_serves() -> None:
    document = manifest("http")
    assert document["settings"]["socket_mode_enabled"] is False
    served = events_route(cast(Any, None), "s" * 32, "/finetune").path  # what SlackAdapter.mount serves
    assert PUBLIC_ROUTES["slack"] == {served}  # and what the load balancers forward (tests/test_public_routes.py)
    found = urls(document)
    assert set(found) == {".features.slash_commands[0].url", ".settings.interactivity.request_url"}
    for where, url in found.items():
        parts = urlsplit(url)
        assert (parts.scheme, parts.hostname, parts.path, parts.query) == ("https", PLACEHOLDER_HOST, served, ""), where


def test_the_socket_mode_manifest_names_no_url() -> None:
    document = manifest("socket")
    assert document["settings"]["socket_mode_enabled"] is True
    assert urls(document) == {}


def without_transport(document: dict[str, Any]) -> dict[str, Any]:
    stripped = yaml.safe_load(yaml.safe_dump(document))
    for command in stripped["features"]["slash_commands"]:
        command.pop("url", None)
    stripped["settings"]["interactivity"].pop("request_url", None)
    stripped["settings"].pop("socket_mode_enabled")
    return cast(dict[str, Any], stripped)


def test_the_two_manifests_differ_only_in_how_slack_reaches_the_bot() -> None:
    assert without_transport(manifest("http")) == without_transport(manifest("socket"))


def test_the_guides_point_at_the_manifest_files_and_hold_no_copy() -> None:
    guides = {path: path.read_text() for path in sorted((ROOT / "docs").rglob("*.md"))}
    for name in ("deploy/slack/manifest.yaml", "deploy/slack/manifest-socket.yaml"):
        assert any(name in text for text in guides.values()), f"no guide names {name}"
    copies = [str(path.relative_to(ROOT)) for path, text in guides.items() if "oauth_config" in text]
    assert not copies, f"a manifest copied into a guide drifts from deploy/slack/: {copies}"

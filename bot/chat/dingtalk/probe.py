"""Is the DingTalk set-up usable? ``finetune-bot check`` asks DingTalk for the app's access token, as the bot does at
start (:meth:`bot.chat.dingtalk.adapter.DingTalk.check`), through the same OpenAPI client and its classification
of failures (:mod:`bot.chat.dingtalk.transport`)."""

from __future__ import annotations

import aiohttp

from bot.chat.delivery import PermanentDeliveryError, TransientDeliveryError
from bot.chat.dingtalk.openapi import OpenApi
from bot.checks.result import Check, failed, passed

CREDENTIALS_FIX = (
    "set DINGTALK_CLIENT_ID and DINGTALK_CLIENT_SECRET to the app's Client ID and Client Secret (AppKey / AppSecret)"
)


async def check_dingtalk(client_id: str | None, client_secret: str | None, endpoint: str) -> list[Check]:
    """Nothing when DingTalk is not configured (no client id)."""
    if not client_id:
        return []
    name = "DingTalk app"
    if not client_secret:
        return [failed(name, "DINGTALK_CLIENT_ID is set but DINGTALK_CLIENT_SECRET is not", CREDENTIALS_FIX)]
    async with aiohttp.ClientSession() as session:
        try:
            await OpenApi(session, client_id, client_secret, endpoint).access_token()
        except PermanentDeliveryError as exc:
            return [failed(name, f"DingTalk refused its credentials: {exc}", CREDENTIALS_FIX)]
        except TransientDeliveryError as exc:
            return [failed(name, f"not checked, DingTalk did not answer: {exc}", "check the network path to DingTalk")]
    return [passed(name, f"{client_id} gets an access token")]

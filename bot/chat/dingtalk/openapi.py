"""The few DingTalk OpenAPI calls the bot makes, asynchronously, with the app's access token.

The SDK has these calls too, but they block on ``requests``, log failures instead of raising them, and read the
endpoint once at import; the bot needs them on the event loop, classified transient or permanent, and pointed
at ``DINGTALK_OPENAPI_ENDPOINT`` (a local fake in tests). One call has no OpenAPI form: a media upload (an image
to show in a markdown message) goes to the older oapi host (``DINGTALK_OAPI_ENDPOINT``), with the same app token
in the query, as DingTalk accepts for an internal app.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp
from yarl import URL

from bot.chat.delivery import PermanentDeliveryError, TransientDeliveryError
from bot.chat.dingtalk.transport import Rejected, call, post_file

DEFAULT_ENDPOINT = "https://api.dingtalk.com"
DEFAULT_OAPI_ENDPOINT = "https://oapi.dingtalk.com"
TOKEN_HEADER = "x-acs-dingtalk-access-token"
TOKEN_MARGIN_SECONDS = 300  # renew this long before DingTalk says the token expires
# How DingTalk says "this access token is no good" (expired, revoked, rotated): the OpenAPI answers HTTP 400
# InvalidAuthentication ("不合法的access_token"), not 401; the older oapi style uses errcode 40014 (invalid) and
# 42001 (expired). Any 401 counts too. Forbidden.AccessDenied.AccessTokenPermissionDenied is not among them: the
# token is fine, the app lacks a permission, and a new token would lack it as well.
RENEW_CODES = frozenset({"InvalidAuthentication", "40014", "42001"})


class OpenApi:
    def __init__(
        self,
        session: aiohttp.ClientSession,
        client_id: str,
        client_secret: str,
        endpoint: str = DEFAULT_ENDPOINT,
        clock: Callable[[], float] = time.monotonic,
        oapi_endpoint: str = DEFAULT_OAPI_ENDPOINT,
    ) -> None:
        self.session = session
        self.client_id = client_id
        self.client_secret = client_secret
        self.endpoint = endpoint.rstrip("/")
        self.oapi_endpoint = oapi_endpoint.rstrip("/")
        self.clock = clock
        self._token: str | None = None
        self._expires = 0.0
        self._lock = asyncio.Lock()

    async def access_token(self) -> str:
        """The app's token (``/v1.0/oauth2/accessToken``), fetched once and renewed before it expires."""
        async with self._lock:
            if self._token is None or self.clock() >= self._expires:
                body = {"appKey": self.client_id, "appSecret": self.client_secret}
                answer = await call(self.session, "POST", self._url("/v1.0/oauth2/accessToken"), "access token", body)
                token = answer.get("accessToken")
                if not isinstance(token, str) or not token:
                    raise PermanentDeliveryError(f"access token: no accessToken in the answer {answer}")
                self._token = token
                self._expires = self.clock() + float(answer.get("expireIn", 7200)) - TOKEN_MARGIN_SECONDS
            return self._token

    async def request(self, method: str, path: str, what: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """An authenticated call; a token DingTalk no longer accepts (:func:`token_refused`) is renewed and the call
        made once more."""
        for renewed in (False, True):
            token = await self.access_token()
            try:
                return await call(self.session, method, self._url(path), what, body, {TOKEN_HEADER: token})
            except Rejected as exc:
                if renewed or not token_refused(exc):
                    raise
                async with self._lock:
                    if self._token == token:
                        self._token = None
        raise AssertionError("unreachable")

    async def create_and_deliver_card(
        self, template_id: str, out_track_id: str, conversation: str, robot_code: str, params: Mapping[str, str]
    ) -> None:
        """Create a card from the template and deliver it to a group; button clicks come back over the stream."""
        body = {
            "cardTemplateId": template_id,
            "outTrackId": out_track_id,
            "callbackType": "STREAM",
            "cardData": {"cardParamMap": dict(params)},
            "openSpaceId": f"dtv1.card//IM_GROUP.{conversation}",
            "imGroupOpenSpaceModel": {"supportForward": True},
            "imGroupOpenDeliverModel": {"robotCode": robot_code},
            "userIdType": 1,
        }
        answer = await self.request("POST", "/v1.0/card/instances/createAndDeliver", "card create", body)
        result = answer.get("result") if isinstance(answer.get("result"), dict) else {}
        failed = [d for d in (result or {}).get("deliverResults", []) if not d.get("success", True)]
        if failed:
            raise PermanentDeliveryError(f"card delivery to {conversation} failed: {failed[0].get('errorMsg')}")

    async def update_card(self, out_track_id: str, params: Mapping[str, str]) -> None:
        """Replace the given card fields in place (the others keep their values)."""
        body = {
            "outTrackId": out_track_id,
            "cardData": {"cardParamMap": dict(params)},
            "cardUpdateOptions": {"updateCardDataByKey": True},
            "userIdType": 1,
        }
        await self.request("PUT", "/v1.0/card/instances", "card update", body)

    async def send_group_markdown(self, conversation: str, robot_code: str, title: str, text: str) -> None:
        """A markdown message from the app robot to a group it is in (no mentions: that is the webhooks' job)."""
        body = {
            "robotCode": robot_code,
            "openConversationId": conversation,
            "msgKey": "sampleMarkdown",
            "msgParam": json.dumps({"title": title, "text": text}, ensure_ascii=False),
        }
        await self.request("POST", "/v1.0/robot/groupMessages/send", "group message", body)

    async def send_user_markdown(self, user_id: str, robot_code: str, title: str, text: str) -> None:
        """A markdown message from the app robot to one person, in their one-to-one chat with it
        (``/v1.0/robot/oToMessages/batchSend`` with one staff id). DingTalk answers 200 and lists a staff id it
        did not deliver to (unknown, outside the app's range, over its rate): that is a failure here too."""
        body = {
            "robotCode": robot_code,
            "userIds": [user_id],
            "msgKey": "sampleMarkdown",
            "msgParam": json.dumps({"title": title, "text": text}, ensure_ascii=False),
        }
        answer = await self.request("POST", "/v1.0/robot/oToMessages/batchSend", "one-to-one message", body)
        if user_id in (answer.get("flowControlledStaffIdList") or ()):
            raise TransientDeliveryError(f"one-to-one message to {user_id}: over DingTalk's rate")
        if user_id in (answer.get("invalidStaffIdList") or ()):
            raise PermanentDeliveryError(f"one-to-one message: DingTalk knows no staff id {user_id}")

    async def upload_image(self, content: bytes, filename: str) -> str:
        """Upload a PNG (``/media/upload``, type image); its ``media_id``, which a markdown message can show."""
        for renewed in (False, True):
            token = await self.access_token()
            url = URL(self.oapi_endpoint + "/media/upload").with_query(access_token=token, type="image")
            try:
                answer = await post_file(self.session, url, "media upload", "media", filename, content, "image/png")
            except Rejected as exc:
                if renewed or not token_refused(exc):
                    raise
                async with self._lock:
                    if self._token == token:
                        self._token = None
                continue
            media_id = answer.get("media_id")
            if not isinstance(media_id, str) or not media_id:
                raise PermanentDeliveryError(f"media upload: no media_id in the answer {answer}")
            return media_id
        raise AssertionError("unreachable")

    def _url(self, path: str) -> str:
        return self.endpoint + path


def token_refused(exc: Rejected) -> bool:
    """Did DingTalk refuse the call for its access token (so a new token may make it go through)?"""
    return exc.status == 401 or exc.code in RENEW_CODES

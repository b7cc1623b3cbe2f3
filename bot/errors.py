"""The bot's one error tree: a root, :class:`FinetuneError`, and one family per port, with a class only where a
caller catches it by type, so callers catch a family and never a platform's SDK type.

    FinetuneError
    ├── ConfigError            a setting or the config file is unusable
    │   └── AlreadyOwned       (bot/owner_lock.py) another live process works on that directory
    ├── StoreUnavailable       the store (Redis) gave no answer: down, restarting, loading, unreachable, or a write no
    │                          replica (or AOF) confirmed in time (bot/durability.py)
    ├── JobCapReached          (bot/store.py) a write that would take a job past a node cap: nothing written
    ├── CloudError             a cloud (AWS, Alibaba, local): launch, terminate, interrupt-test, list, and the objects
    │   │                      the bot writes itself (specs, control and key objects on S3 / OSS)
    │   ├── LaunchError, ForeignInstance
    │   ├── CloudRefused       the cloud's API (or its object store) answered with an error code
    │   └── CloudUnavailable   no answer from the cloud's API or its object store (network, timeout, a broken reply)
    ├── ChatError              a chat platform (Slack, DingTalk) did not take a message
    │   ├── TransientDeliveryError   (bot/chat/delivery.py) try again, after ``retry_after`` when it said so
    │   └── PermanentDeliveryError   (bot/chat/delivery.py) retrying changes nothing: dropped
    │       └── Rejected             (bot/chat/dingtalk/transport.py) DingTalk refused: its status and code
    ├── InputRefused           input from outside that the bot does not take: a runner's report, a Slack request, an
    │                          SNS signature or its certificate, a simulator scenario; ``status`` is what the edge
    │                          answers
    └── HandBack               (bot/bus.py) a handler's word to the bus: hand the message back, the consumer stops

What no caller tells apart is its parent: a store write that kept losing the race to other writers is a plain
FinetuneError (the bus retries the event, as for any failure).

Each adapter maps what its SDK raises once, at its own edge: redis-py in ``bot/redis_server.py`` (the client every
bot module is handed), botocore in ``bot/cloud/aws/errors.py`` (the wrapper every AWS client and the S3 / OSS object
clients are opened in), the Tea / darabonba SDK in ``bot/cloud/aliyun/errors.py`` (the API client's calls and the boot
helpers'), slack_sdk in ``bot/chat/slack/errors.py``, DingTalk's HTTP API in ``bot/chat/dingtalk/transport.py``; past
that edge only these travel. The runner never imports the bot: its errors have their own root,
``runner.errors.RunnerError``; the pure core's, ``handlers.errors.CoreError``.

Nothing here imports another bot module, so every module may import it (settings and chat adapters alike).
"""

from __future__ import annotations


class FinetuneError(Exception):
    """The root of every error the bot's ports raise: ``except FinetuneError`` is "one of ours"."""


class ConfigError(FinetuneError, ValueError):
    """A setting or the config file is unusable: one line saying which and why (the CLI exits 2, no traceback)."""


class StoreUnavailable(FinetuneError):
    """Redis did not answer: down, restarting, loading its data, unreachable, or refusing the credentials. An outage,
    not a bug: the bus, the outbox and the sources wait and try again; HTTP edges answer 503. A write that reached the
    primary but no replica (or the AOF) within ``redis.durability``'s bounded wait is one too. The message names the
    server but never a password."""


class CloudError(FinetuneError, RuntimeError):
    """A cloud did not do what the bot asked (launch, terminate, interrupt-test, stop the runner, list, write one of
    its objects); the message says why and what to fix. Every provider raises these, and only these, from the cloud
    port's methods."""


class CloudUnavailable(CloudError):
    """The cloud's API or its object store gave no usable answer (connection refused, timeout, a broken reply, a 5xx
    the object store still answered after the SDK's retries): trying later may work."""


class CloudRefused(CloudError):
    """The cloud's API answered ``action`` with an error ``code`` (``InvalidInstanceID.NotFound``,
    ``OperationDenied.NoStock``, ``AccessDenied``, …), or its object store did (``action`` then names the call and the
    object: ``PutObject s3://bucket/key``; ``NoSuchBucket``, ``HTTP 403``): each cloud's SDK errors map to it (or to
    :class:`CloudUnavailable`) once, at its client (``bot/cloud/aws/errors.py``, ``bot/cloud/aliyun/errors.py``)."""

    def __init__(self, action: str, code: str, message: str) -> None:
        super().__init__(f"{action}: {code}: {message}")
        self.action = action
        self.code = code
        self.message = message


class LaunchError(CloudError):
    """No capacity, no permission, a bad template: the attempt did not start.

    ``capacity``: every try was refused for capacity (the spot policy may try another zone, on-demand, or later);
    ``zone``: the zone the launch was pinned to, if it was; ``refused_zones``: the zones that refused it for capacity,
    in the order tried (a region whose zones all refused is one the spot authority avoids for a while)."""

    def __init__(
        self, message: str, *, capacity: bool = False, zone: str | None = None, refused_zones: tuple[str, ...] = ()
    ) -> None:
        super().__init__(message)
        self.capacity = capacity
        self.zone = zone
        self.refused_zones = refused_zones


class ForeignInstance(CloudError):
    """The instance does not carry the tags of the job the action is for: the provider left it untouched. Not
    retried: no later try can make it that job's."""


class ChatError(FinetuneError):
    """A chat platform did not take a message (see ``bot/chat/delivery.py`` for the transient / permanent split)."""


class InputRefused(FinetuneError):
    """Input from outside that the bot does not take (unsigned, forged, malformed, beyond a cap): a runner's report, a
    Slack request, an SNS message's signature or its certificate, a simulator scenario. The edge that received it
    answers ``status`` (400 malformed, 401 unsigned, 403 forged or not ours, 503 not checked now: ask again later)
    with ``reason``, and ``detail`` (a report's validation errors, for the sender) where there are any; nothing
    changes. The pure core's counterpart for the messages it parses is ``handlers.errors.UnrecognisedMessage``."""

    def __init__(self, reason: str, *, status: int = 400, detail: list[dict[str, object]] | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.status = status
        self.detail = detail or []

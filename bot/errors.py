"""The bot's one error tree: a root, :class:`FinetuneError`, and one branch per port family, so callers catch a
family and never a platform's SDK type.

    FinetuneError
    ├── ConfigError            a setting or the config file is unusable
    │   └── AlreadyOwned       (bot/owner_lock.py) another live process works on that directory
    ├── StoreError             the store (Redis)
    │   ├── StoreUnavailable   no answer: down, restarting, loading, unreachable
    │   │   └── NotDurable     (bot/durability.py) a write no replica (or AOF) confirmed in time
    │   └── StoreConflict, JobCapReached  (bot/store.py) a change the store would not write
    ├── CloudError             a cloud (AWS, Alibaba, local): launch, terminate, interrupt-test, list
    │   ├── LaunchError, ForeignInstance
    │   ├── CloudRefused       the cloud's API answered with an error code
    │   └── CloudUnavailable   no answer from the cloud's API (network, timeout, a broken reply)
    ├── ObjectStoreError       object storage the bot writes itself (AWS S3, Alibaba OSS)
    │   ├── ObjectRefused      an error answer (code and message)
    │   └── ObjectStoreUnavailable  no answer
    ├── ChatError              a chat platform (Slack, DingTalk) did not take a message
    └── InputRefused           input from outside that the bot does not take: a runner's report (ReportRefused), a
                               Slack request (ingress.Refused), an SNS signature (SignatureError), a fetch of its
                               certificate (FetchError), a simulator scenario (simulate.InputError)

Each adapter maps what its SDK raises once, at its own edge: redis-py in ``bot/redis_server.py`` (the client every
bot module is handed), botocore in ``bot/cloud/aws/errors.py`` (the wrapper every AWS client and the S3 / OSS object
clients are opened in), the Tea / darabonba SDK in ``bot/cloud/aliyun/errors.py`` (the API client's calls and the boot
helpers'), slack_sdk in
``bot/chat/slack/errors.py``, DingTalk's HTTP API in ``bot/chat/dingtalk/transport.py``; past that edge only these
travel. The runner never imports the bot: its errors
have their own root, ``runner.errors.RunnerError``.

Nothing here imports another bot module, so every module may import it (settings and chat adapters alike).
"""

from __future__ import annotations


class FinetuneError(Exception):
    """The root of every error the bot's ports raise: ``except FinetuneError`` is "one of ours"."""


class ConfigError(FinetuneError, ValueError):
    """A setting or the config file is unusable: one line saying which and why (the CLI exits 2, no traceback)."""


class StoreError(FinetuneError):
    """The store (Redis) did not do what the bot asked."""


class StoreUnavailable(StoreError):
    """Redis did not answer: down, restarting, loading its data, unreachable, or refusing the credentials. An outage,
    not a bug: the bus, the outbox and the sources wait and try again; HTTP edges answer 503. The message names the
    server but never a password."""


class CloudError(FinetuneError, RuntimeError):
    """A cloud did not do what the bot asked (launch, terminate, interrupt-test, stop the runner, list); the message
    says why and what to fix. Every provider raises these, and only these, from the cloud port's methods."""


class CloudUnavailable(CloudError):
    """The cloud's API gave no usable answer (connection refused, timeout, a broken reply): trying later may work."""


class CloudRefused(CloudError):
    """The cloud's API answered ``action`` with an error ``code`` (``InvalidInstanceID.NotFound``,
    ``OperationDenied.NoStock``, ``AccessDenied``, …): each cloud's SDK errors map to it (or to
    :class:`CloudUnavailable`) once, at its client (``bot/cloud/aws/errors.py``, ``bot/cloud/aliyun/errors.py``)."""

    def __init__(self, action: str, code: str, message: str) -> None:
        super().__init__(f"{action}: {code}: {message}")
        self.action = action
        self.code = code
        self.message = message


class LaunchError(CloudError):
    """No capacity, no permission, a bad template: the attempt did not start.

    ``capacity``: every try was refused for capacity (the spot policy may try another zone, on-demand, or later);
    ``zone``: the zone the launch was pinned to, if it was."""

    def __init__(self, message: str, *, capacity: bool = False, zone: str | None = None) -> None:
        super().__init__(message)
        self.capacity = capacity
        self.zone = zone


class ForeignInstance(CloudError):
    """The instance does not carry the tags of the job the action is for: the provider left it untouched. Not
    retried: no later try can make it that job's."""


class ObjectStoreError(FinetuneError):
    """Object storage (S3, OSS) refused or did not answer a write the bot made itself (specs, control objects, key
    objects). The cloud provider turns it into its port's error (a LaunchError for a spec that could not be written)."""


class ObjectRefused(ObjectStoreError):
    """The object store answered with an error ``code`` (``AccessDenied``, ``NoSuchBucket``, ``HTTP 500``…);
    ``action`` names the call and the object."""

    def __init__(self, action: str, code: str, message: str) -> None:
        super().__init__(f"{action}: {code}: {message}")
        self.action = action
        self.code = code
        self.message = message


class ObjectStoreUnavailable(ObjectStoreError):
    """The object store gave no answer (connection refused, timeout, a broken reply), after the SDK's retries."""


class ChatError(FinetuneError):
    """A chat platform did not take a message (see ``bot/chat/delivery.py`` for the transient / permanent split)."""


class InputRefused(FinetuneError):
    """Input from outside that the bot does not take (unsigned, forged, malformed, beyond a cap): the edge that
    received it answers or logs why, and nothing changes. The pure core's counterpart for the messages it parses is
    ``handlers.errors.UnrecognisedMessage``."""

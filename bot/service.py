"""Wire the bot together (Redis, store, bus, timers, HTTP server, cloud, chat) and run it until stopped.

``serve``, ``demo`` and ``chat`` all run this same service; they differ only in the chat adapter in front.
Three consumers run side by side, each on its own queue (:mod:`bot.keys`): the bot on the events stream, the
chat outbox on the chat stream, the cloud executor on the cloud stream; and the timer loop and the reconcile
loop (:mod:`bot.reconciler`: at start and periodically, jobs against what the cloud lists). Stopping is clean:
each consumer finishes the message in flight (or leaves it pending for another replica), then everything opened
is closed in the reverse order of opening: each part is put on one :class:`contextlib.AsyncExitStack` as it is
opened, with its own close, so a start that fails half-way closes exactly what it had opened.
"""

from __future__ import annotations

import asyncio
import errno
import gc
import logging
import os
import secrets
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

import aiohttp
import redis.asyncio as aioredis
from aiohttp import web

from bot.bus import default_consumer_name
from bot.bus_set import Bus, bus_for
from bot.chat.base import ChatPort, PortDeliverer
from bot.chat.console import ConsoleChat, ConsoleDeliverer
from bot.chat.delivery import Platform
from bot.chat.dingtalk.config import DingTalkConfig
from bot.chat.outbox import ChatOutbox
from bot.chat.refs import ChatRefs
from bot.cloud.aliyun.settings import static_key_refusal
from bot.cloud.aws.provider import AwsCloud
from bot.cloud.aws.queue_url import queue_name, queue_region
from bot.cloud.aws.region import region_name
from bot.cloud.base import CloudProvider, RenewsStorageCredentials
from bot.cloud.local.profile import load_profile
from bot.cloud.local.provider import LocalCloud
from bot.cloud_effects import CloudEffects
from bot.core import Bot
from bot.costs import MIN_TOKEN_LENGTH as COSTS_TOKEN_LENGTH
from bot.costs import costs_routes
from bot.durability import DurableWrites
from bot.errors import ConfigError
from bot.http import REPORTS_PATH, build_app, server_logger
from bot.keys import DEFAULT_KEYS, Keys
from bot.owner_lock import AlreadyOwned, OwnerLock
from bot.pagers.calls import PagerDeliverer
from bot.pagers.setup import pager_tools, webhook_secrets
from bot.pagers.webhooks import pager_routes
from bot.partitions import open_keys
from bot.reconciler import Reconciler
from bot.redis_server import RedisHandle, open_redis, redacted
from bot.replicas import Replicas
from bot.report_gate import ReportGate
from bot.retention import Retention
from bot.settings import FileConfig, Settings, all_recipes, load_config
from bot.sources.aliyun_http import MIN_TOKEN_LENGTH, Network, aliyun_routes, parse_networks
from bot.sources.aws_intake import AwsIntake
from bot.sources.sns_http import sns_routes
from bot.sources.sns_signature import SHA1_REFUSED_METRIC, SnsVerifier
from bot.sources.sqs import SqsSource
from bot.storage_renewal import StorageRenewal
from bot.store import JobStore
from bot.supervision import Supervisor
from bot.timers import Timers
from handlers.clock import utcnow
from handlers.pagers import Tool
from handlers.permissions import describe
from handlers.report_keys import ReportKeys

if TYPE_CHECKING:
    from bot.chat.dingtalk.adapter import DingTalk
    from bot.chat.slack.adapter import SlackAdapter

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class CloudWiring:
    """What building a cloud may use: the settings, the config file, the bot's Redis and the runners' report keys
    (each launch hands its runner the key of its own attempt, never the master)."""

    settings: Settings
    config: FileConfig
    redis: RedisHandle
    report_keys: ReportKeys
    keys: Keys = DEFAULT_KEYS  # the store's keys (its partitions): the local cloud writes its events to them


CloudFactory = Callable[[CloudWiring], CloudProvider]


def remote_cloud(settings: Settings, config: FileConfig, report_keys: ReportKeys) -> CloudProvider | None:
    """The AWS or Alibaba cloud ``FINETUNE_CLOUD`` names, built from its config section (ConfigError when that is
    missing or unusable); None for the local cloud. Opens no connection: ``finetune-bot check`` builds it too."""
    if settings.finetune_cloud == "aws":
        if config.aws is None:
            raise ConfigError("FINETUNE_CLOUD=aws needs an aws: section in FINETUNE_CONFIG (bucket, image_id, …)")
        return AwsCloud(config.aws, report_keys=report_keys)
    if settings.finetune_cloud == "aliyun":
        if config.aliyun is None:
            raise ConfigError("FINETUNE_CLOUD=aliyun needs an aliyun: section in FINETUNE_CONFIG (region, bucket…)")
        if config.aliyun.report_url and not settings.finetune_report_secret:
            raise ConfigError("aliyun.report_url needs FINETUNE_REPORT_SECRET: runners sign their reports with it")
        refusal = static_key_refusal(config.aliyun, os.environ)
        if refusal:
            raise ConfigError(refusal)
        from bot.cloud.aliyun.provider import AliyunCloud  # only here: Alibaba's SDKs take a second to import

        return AliyunCloud(config.aliyun, report_keys=report_keys)
    return None


def open_cloud(wiring: CloudWiring) -> CloudProvider:
    """The cloud ``FINETUNE_CLOUD`` names, built from its config section (ConfigError when that is missing).

    AWS runners report through SNS -> SQS (the provider adds the topic to every spec), Alibaba runners to the
    bot's public URL (``aliyun.report_url``) signed with their attempt's key (derived from ``FINETUNE_REPORT_SECRET``,
    :mod:`handlers.report_keys`); local instances are processes
    of their own, registered in Redis, whose reports reach any live replica through the instance
    (``bot/cloud/local/instance.py``).
    """
    settings, config, redis = wiring.settings, wiring.config, wiring.redis
    remote = remote_cloud(settings, config, wiring.report_keys)
    if remote is not None:
        return remote
    return LocalCloud(
        settings.finetune_state_dir,
        redis.client,
        redis.url,
        keys=wiring.keys,
        grace_seconds=settings.finetune_local_grace_seconds,
        report_keys=wiring.report_keys,
        dialect=settings.finetune_local_dialect,
        checkpoint_base=settings.finetune_local_checkpoints,
        zones=tuple(settings.finetune_local_zones.split(",")),
        spot_price=settings.finetune_local_spot_price,
        on_demand_price=settings.finetune_local_on_demand_price,
        profile=load_profile(settings.finetune_local_profile, settings.finetune_local_time_scale),
    )


def with_admins(config: FileConfig, admins: Sequence[str]) -> FileConfig:
    """``config`` with ``admins`` among its policy's admins."""
    added = [admin for admin in admins if admin not in config.policy.admins]
    if not added:
        return config
    policy = config.policy.model_copy(update={"admins": [*config.policy.admins, *added]})
    return config.model_copy(update={"policy": policy})


class BotService:
    """``cloud``: how to build the cloud (default :func:`open_cloud`); a test builds its own on the same wiring."""

    def __init__(
        self,
        settings: Settings,
        chat: ChatPort | None = None,
        cloud: CloudFactory = open_cloud,
        clock: Callable[[], datetime] = utcnow,
        admins: Sequence[str] = (),
    ) -> None:
        self.settings = settings
        # Admins besides the config's: the console's own user in ``chat`` (whoever runs the bot holds its config and
        # its state already: refusing them their own jobs' costs protects nothing).
        self.admins = tuple(admins)
        self.clock = clock  # the bot's and the timers' idea of now: tests step it to walk an escalation ladder
        self.chat = chat or ConsoleChat()
        self.cloud_factory = cloud
        self.stopping = asyncio.Event()
        self._stack = AsyncExitStack()
        self.loops = Supervisor(self.stopping)
        self._redis: RedisHandle | None = None
        self._http: web.AppRunner | None = None
        self._cloud: CloudProvider | None = None
        self._bus: Bus | None = None
        self._timers: Timers | None = None
        self._effects: CloudEffects | None = None
        self._bot: Bot | None = None
        self._reconciler: Reconciler | None = None
        self._slack: SlackAdapter | None = None
        self._costs_token: str | None = None  # GET /costs, when FINETUNE_COSTS_TOKEN is set
        self._outbox: ChatOutbox | None = None
        self._reports: ReportGate | None = None
        self.dingtalk: DingTalk | None = None  # DingTalk (bot/chat/dingtalk), when DINGTALK_CLIENT_ID is set
        self.port = 0
        # One bot per state dir (its Redis data, local instances, checkpoints): held from start to stop.
        self._owner = OwnerLock(settings.finetune_state_dir / "bot.lock")

    @property
    def bot(self) -> Bot:
        assert self._bot is not None, "BotService is not started"
        return self._bot

    @property
    def redis_url(self) -> str:
        assert self._redis is not None, "BotService is not started"
        return self._redis.url

    @property
    def bus(self) -> Bus:
        assert self._bus is not None, "BotService is not started"
        return self._bus

    @property
    def reports(self) -> ReportGate:
        """The one door of runner reports: its ``clock`` (the wall clock) judges a report's freshness."""
        assert self._reports is not None, "BotService is not started"
        return self._reports

    @property
    def timers(self) -> Timers:
        """The timer loop (escalation steps, deadlines): its ``rounds`` tell that a moved clock was looked at."""
        assert self._timers is not None, "BotService is not started"
        return self._timers

    @property
    def effects(self) -> CloudEffects:
        """The cloud executor (launch, terminate, interrupt-test, stop the runner)."""
        assert self._effects is not None, "BotService is not started"
        return self._effects

    @property
    def reconciler(self) -> Reconciler:
        """The reconcile loop's rounds (jobs against the cloud's listing), at start and every period."""
        assert self._reconciler is not None, "BotService is not started"
        return self._reconciler

    @property
    def slack(self) -> SlackAdapter | None:
        """The Slack adapter, when SLACK_BOT_TOKEN is set."""
        return self._slack

    @property
    def outbox(self) -> ChatOutbox | None:
        """The durable chat outbox every note goes through (Slack, DingTalk, and the console as the fallback)."""
        return self._outbox

    async def start(self) -> BotService:
        self._own_state_dir()  # first: a second bot says only that, and touches nothing of the first one's
        self._stack.callback(self._owner.release)
        try:
            config = with_admins(load_config(self.settings), self.admins)
            log.info(describe(config.policy))  # the permission model in force
            if not config.policy.admins:
                log.warning("no policy.admins: only a job's owner and team act on it, and nobody sees every channel")
            aliyun_intake = self._check_aliyun(config)  # before anything starts
            self._costs_token = self._check_costs_token()
            # Chat platforms are checked before anything starts: a refused token is one error, and nothing to undo.
            self._slack = await self._connect_slack(config)
            if self._slack is not None:
                self._stack.push_async_callback(self._slack.close)
            return await self._start(config, aliyun_intake)
        except BaseException:
            await self.stop()
            raise

    def _own_state_dir(self) -> None:
        """ConfigError when another live bot (serve, chat or demo) already works on this state dir."""
        state_dir = self.settings.finetune_state_dir
        try:
            self._owner.acquire()
        except AlreadyOwned as exc:
            raise ConfigError(
                f"another finetune-bot (pid {exc.pid or '?'}) already runs on FINETUNE_STATE_DIR={state_dir}; "
                "stop it first, or give this one its own FINETUNE_STATE_DIR"
            ) from None
        except OSError as exc:
            raise ConfigError(f"FINETUNE_STATE_DIR={state_dir} cannot be used: {exc.strerror}") from None

    async def _start(self, config: FileConfig, aliyun_intake: tuple[str, list[Network]] | None) -> BotService:
        secret = self.settings.finetune_report_secret or secrets.token_urlsafe(32)
        stack = self._stack
        try:
            self._redis = redis = await open_redis(self.settings)
        except AlreadyOwned as exc:  # the state dir is ours, so this is a server started by hand on its data
            raise ConfigError(f"a Valkey (owner pid {exc.pid or '?'}) already serves {exc.path.parent}") from None
        stack.push_async_callback(redis.close)

        def own_client() -> aioredis.Redis:
            """A client with a pool of its own (one per consumer, so a blocking read holds up no other)."""
            client = redis.new_client()
            stack.push_async_callback(client.aclose)
            return client

        keys = await open_keys(redis.client, DEFAULT_KEYS.prefix)  # the partitions this store was created with
        store = JobStore(redis.client, keys, durability=DurableWrites.of(config.redis))
        consumer = default_consumer_name()
        # A cloud's word about an instance runs in its job's lane, with the runner's reports of the same fact.
        bus = bus_for(own_client(), keys, "events", consumer=consumer, jobs_of_instances=store.jobs_for_instances)
        self._bus = bus
        await bus.ensure_group()
        self._timers = timers = Timers(redis.client, keys, clock=self.clock)
        self.dingtalk = await self._start_dingtalk(config, store)

        self._cloud = cloud = self.cloud_factory(CloudWiring(self.settings, config, redis, ReportKeys(secret), keys))
        stack.push_async_callback(cloud.close)
        # A report's key is its attempt's (the salt stored with it); its URIs lie under its job's own prefix.
        self._reports = reports = ReportGate(secret, store.key_salt, cloud.checkpoint_uri, stamp=self.clock)
        intake = self._aws_intake(reports, config)
        sns_verifier = SnsVerifier(allow_sha1=self.settings.finetune_sns_allow_sha1)
        app = build_app(
            store,
            bus,
            reports,
            extra_metrics=lambda: {
                **intake.metrics(),
                **(self._outbox.metrics() if self._outbox else {}),
                SHA1_REFUSED_METRIC: float(sns_verifier.sha1_refused),
            },
        )
        if self.settings.sns_topics:
            sns_parse = intake.for_route("sns").parse
            app.add_routes(sns_routes(bus.publish, self.settings.sns_topics, sns_verifier, parse=sns_parse))
        if aliyun_intake is not None:
            token, networks = aliyun_intake
            insecure = self.settings.finetune_aliyun_webhook_allow_insecure
            app.add_routes(aliyun_routes(bus.publish, token, networks, allow_insecure=insecure))
        if self._costs_token is not None:
            app.add_routes(costs_routes(store, self._costs_token, config.policy.teams, self.clock))
        if self._slack is not None:
            self._slack.mount(app)
        pager = await self._pager(config)
        app.add_routes(pager_routes(self._tool_ack, self.clock, *webhook_secrets(self.settings)))
        self._http = web.AppRunner(app, access_log=None, logger=server_logger())
        await self._http.setup()
        stack.push_async_callback(self._http.cleanup)
        host, port = self.settings.finetune_http_host, self.settings.finetune_http_port
        try:
            await web.TCPSite(self._http, host, port).start()
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
            raise ConfigError(
                f"port {port} on {host} is in use: set FINETUNE_HTTP_PORT to a free port (0 lets the system pick one)"
            ) from None
        self.port = int(self._http.addresses[0][1])

        self._outbox = outbox = self._chat_outbox(own_client(), store, consumer, pager)
        recipes = all_recipes(config)
        # Every report target is the cloud's own (SNS, the report URL, the local instance): none extra here.
        effects = CloudEffects(own_client(), store, cloud, recipes, [], consumer=consumer)
        self._effects = effects
        self._bot = bot = Bot(store, cloud, config.policy, recipes, clock=self.clock, oncall=config.oncall)
        lifecycle = config.policy.lifecycle
        self._reconciler = reconciler = Reconciler(redis.client, store, cloud, lifecycle, self.clock, consumer)
        retention = Retention(store, config.policy.retention_days, self.clock)
        host = self.settings.finetune_http_host
        report_url = f"http://{'127.0.0.1' if host in ('0.0.0.0', '::', '') else host}:{self.port}{REPORTS_PATH}"
        self.loops.start(bus.run(bot.handle, self.stopping, bot.handle_many), "bus")
        self.loops.start(timers.run(self.stopping), "timers")
        self.loops.start(outbox.run(self.stopping), "chat-outbox")
        self.loops.start(effects.run(self.stopping), "cloud-effects")
        self.loops.start(Replicas(redis.client, keys).run(report_url, self.stopping), "replica")
        self.loops.start(reconciler.run(self.stopping), "reconcile")
        self.loops.start(retention.run(self.stopping), "retention")
        if isinstance(cloud, RenewsStorageCredentials) and cloud.renews_storage:
            renewal = StorageRenewal(redis.client, store, cloud, self.clock, owner=consumer)
            self.loops.start(renewal.run(self.stopping), "storage-renewal")
        if self._slack is not None:
            await self._slack.start(bot.command, store.claim_once)
        if self.dingtalk is not None:
            self.dingtalk.listen(bot.command, bot.answers_privately)
        queues = self.settings.finetune_sqs_queue_url
        home = region_name(config.aws.region if config.aws is not None else None) if queues else None
        for url in queues:  # one queue per region, each read in its own region
            region = queue_region(url) or home
            sqs = SqsSource(url, bus.publish, region=region, parse=intake.parse)
            self.loops.start(sqs.run(self.stopping), f"sqs {region}/{queue_name(url)}")
        # What exists now (modules, settings, adapters) lives as long as the bot: keep it out of the collector's
        # full passes, which otherwise stall the event loop for a second when the machine is busy.
        gc.freeze()
        log.info(
            "bot up: http on %s:%d, cloud %s, redis %s",
            self.settings.finetune_http_host,
            self.port,
            self.settings.finetune_cloud,
            "embedded" if redis.embedded else redacted(redis.url),
        )
        return self

    def _aws_intake(self, reports: ReportGate, config: FileConfig) -> AwsIntake:
        """What each SNS topic may carry, for the SQS consumer and the SNS endpoint (bot/sources/aws_intake.py)."""
        report_topics = set(self.settings.report_topics)
        if config.aws is not None and config.aws.report_topic_arn:
            report_topics.add(config.aws.report_topic_arn)
        events_topics = self.settings.events_topics
        if (self.settings.sns_topics or self.settings.finetune_sqs_queue_url) and not events_topics:
            log.warning(
                "FINETUNE_EVENTS_TOPICS is not set: cloud events are taken from any SNS topic but a report topic; "
                "set it to the EventBridge topic so that nothing else can speak for the cloud"
            )
        return AwsIntake(reports, report_topics=report_topics, events_topics=events_topics)

    def _check_costs_token(self) -> str | None:
        """GET /costs's bearer token, or None (no route); ConfigError for one too short to stand alone."""
        token = self.settings.secret("finetune_costs_token")
        if token is not None and len(token) < COSTS_TOKEN_LENGTH:
            raise ConfigError(f"FINETUNE_COSTS_TOKEN must be at least {COSTS_TOKEN_LENGTH} characters")
        return token

    # -- Alibaba Cloud: FINETUNE_CLOUD=aliyun and the CloudMonitor / EventBridge routes -------------------------

    def _check_aliyun(self, config: FileConfig) -> tuple[str, list[Network]] | None:
        """The CloudMonitor / EventBridge routes' token and source networks, or None when no token is set (no
        routes); ConfigError for an unusable one. (The Alibaba cloud itself is checked by :func:`open_cloud`.)"""
        token = self.settings.finetune_aliyun_webhook_token
        if not token:
            return None
        if len(token) < MIN_TOKEN_LENGTH:
            raise ConfigError(f"FINETUNE_ALIYUN_WEBHOOK_TOKEN must be at least {MIN_TOKEN_LENGTH} characters")
        try:
            networks = parse_networks(self.settings.finetune_aliyun_webhook_sources)
        except ValueError as exc:
            raise ConfigError(f"FINETUNE_ALIYUN_WEBHOOK_SOURCES: {exc}") from None
        return token, networks

    async def stop(self, before_close: Callable[[], Awaitable[None]] | None = None) -> None:
        """Stop consuming, then close everything; ``before_close`` runs in between (every consumer has stopped,
        Redis and the cloud are still open: a test reclaims the local cloud's instances there)."""
        self.stopping.set()
        await self.loops.wait()
        if before_close is not None and self._redis is not None:
            try:
                await before_close()
            except Exception:
                log.exception("cleaning up before closing")
        await self._stack.aclose()  # each part closes what it opened, last opened first

    async def _pager(self, config: FileConfig) -> Platform | None:
        """PagerDuty / Opsgenie, as the outbox's ``pager`` platform, when a key of either is set (else None)."""
        session = aiohttp.ClientSession()
        self._stack.push_async_callback(session.close)
        tools = pager_tools(self.settings, config.oncall, session)
        return Platform(PagerDeliverer(tools, self.clock), coalesce_cards=False) if tools else None

    async def _tool_ack(self, key: str, tool: Tool, who: str, event_id: str) -> str:
        """A paging tool's acknowledgement (bot/pagers/webhooks.py), once the bot is up."""
        return await self.bot.tool_ack(key, tool, who, event_id)

    def _chat_outbox(
        self, chat_redis: aioredis.Redis, store: JobStore, consumer: str, pager: Platform | None = None
    ) -> ChatOutbox:
        """The chat outbox: each configured platform's deliverer; jobs of any other platform (or none) on the
        console, which gets every card note (a terminal cannot edit one in place)."""
        refs = ChatRefs(chat_redis, store.keys)
        platforms: dict[str, Platform] = {}
        if self._slack is not None:
            platforms["slack"] = Platform(self._slack.deliverer(refs, self.clock))
        if self.dingtalk is not None:
            platforms["dingtalk"] = Platform(self.dingtalk.deliverer)
        charts = self.settings.finetune_state_dir / "charts"  # a terminal shows no image: a job's chart is a file
        port = ConsoleDeliverer(self.chat, charts) if isinstance(self.chat, ConsoleChat) else PortDeliverer(self.chat)
        console = Platform(port, coalesce_cards=False)
        return ChatOutbox(chat_redis, store, platforms, fallback=console, refs=refs, consumer=consumer, pager=pager)

    async def _connect_slack(self, config: FileConfig) -> SlackAdapter | None:
        """The Slack adapter when SLACK_BOT_TOKEN is set, its tokens checked with Slack; else None."""
        from bot.chat.slack.startup import check_secrets  # slack_bolt loads only when Slack is configured

        found = check_secrets(
            self.settings.secret("slack_bot_token"),
            self.settings.secret("slack_signing_secret"),
            self.settings.secret("slack_app_token"),
        )
        if found is None:
            return None
        from bot.chat.slack.adapter import SlackAdapter

        slack = SlackAdapter(found, config.slack, self.settings.slack_api_url)
        await slack.connect()
        log.info("slack: %s mode, command %s", "Socket" if slack.socket_mode else "HTTP", config.slack.command)
        return slack

    async def _start_dingtalk(self, config: FileConfig, store: JobStore) -> DingTalk | None:
        """The DingTalk adapter when DINGTALK_CLIENT_ID is set, its credentials checked with DingTalk; else None."""
        client_id = self.settings.dingtalk_client_id
        if not client_id:
            return None
        from bot.chat.dingtalk.adapter import DingTalk  # the SDK loads only when DingTalk is configured

        dingtalk = DingTalk(
            client_id,
            self.settings.dingtalk_client_secret,
            self.settings.dingtalk_openapi_endpoint,
            config.dingtalk or DingTalkConfig(),
            store,
            oapi_endpoint=self.settings.dingtalk_oapi_endpoint,
        )
        self._stack.push_async_callback(dingtalk.close)  # closed even when the check below refuses it
        await dingtalk.check()
        return dingtalk

    async def __aenter__(self) -> BotService:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

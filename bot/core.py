"""The bot's core loop: a chat command or a bus message in, a decided job change and its effects out.

Where things enter:
- ``command``: ``/finetune …`` from any chat adapter (Slack, DingTalk, the console). Parsed, authorised,
  guarded, then applied to the store as a Change whose outbox carries what must follow. The answer is in the
  language the adapter asks for (the channel's); the handlers' reasons are rendered through the catalogue.
- ``handle``: every message on the events stream (runner reports, cloud events, launch results, timers that fell
  due), applied through :func:`handlers.decide.decide` with a dedup key, so a redelivery changes nothing.

Either way the change's outbox goes, in the same atomic write, straight to the queue of its executor (notes to
the chat outbox, cloud effects to the cloud executor in :mod:`bot.cloud_effects`, timers to the timer set): the bot
itself only decides. From a runner report to the Slack call: ``bot/http.py`` → events stream → :meth:`Bot.handle`
→ :meth:`JobStore.apply` (job, history, dedup, the note onto the chat stream) → ``ChatOutbox.handle`` → the
platform's deliverer.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from pydantic import ValidationError

from bot.charts.series import ChartSeries, Point
from bot.chat import catalog
from bot.chat.catalog import Lang, say
from bot.chat.costs import costs_text
from bot.chat.render import card_text, recipes_text
from bot.cloud.base import (
    CloudError,
    CloudProvider,
    ListsZones,
    ReadsAvailability,
    ReadsTrainerLogs,
    SpansRegions,
    launches_ahead,
)
from bot.costs import read_costs
from bot.keys import Keys
from bot.log_limit import LimitedLog
from bot.rate_limit import Bucket, RateLimiter
from bot.store import DEDUP_TTL, Applied, JobCapReached, JobStore
from handlers.caps import Caps, Full, caps_for, concurrency_refusal, nodes_refusal, price_refusal
from handlers.change import Change
from handlers.clock import utcnow
from handlers.commands import HELP_REASON, Command, parse
from handlers.decide import ack_command, decide, interrupt_test_command, new_job, resume_command, stop_command
from handlers.errors import ReasonError
from handlers.ids import new_job_id
from handlers.job_options import parse_job_options, reserved_parameter, split_overrides
from handlers.jobs import ChatRef, Job, Market
from handlers.messages import (
    CLOUD_EFFECTS,
    TIMERS,
    BusMessage,
    CloudEvent,
    CostsChart,
    LaunchFailed,
    Notify,
    PolicyTick,
    ReportReceived,
    StartDeadline,
    parse_message,
)
from handlers.notes import ChartNote
from handlers.oncall import OnCall
from handlers.outside_text import clean_line
from handlers.pagers import Tool, parse_page_key
from handlers.permissions import (
    channel_id,
    channel_sees_costs,
    cost_refusal,
    cost_teams,
    home_team,
    is_admin,
    job_refusal,
    narrowed,
)
from handlers.policy_config import PolicyConfig
from handlers.private_answers import answered_privately
from handlers.reasons import Reason
from handlers.recipes import Recipe, find_recipe
from handlers.report_freshness import REPORT_SEEN_SECONDS
from handlers.reports import Failed, Interrupted, Notice, Progress
from handlers.restart_overhead import first_step_was
from handlers.spot import Regions, SpotView, managed, steers
from handlers.transitions import next_state

log = logging.getLogger(__name__)

LIST_LENGTH = 20  # jobs ``list`` shows, newest first
LOG_LINES = 30  # lines of the trainer's log ``logs`` shows
LOG_LINE_LENGTH = 300  # characters of each
SPOT_VIEW_SECONDS = 60.0  # how long what the cloud said of zones and prices is used before asking again


class Bot:
    def __init__(
        self,
        store: JobStore,
        cloud: CloudProvider,
        policy: PolicyConfig,
        recipes: Mapping[str, Recipe],
        clock: Callable[[], datetime] = utcnow,
        oncall: OnCall | None = None,
    ) -> None:
        self.store = store
        self.cloud = cloud  # asked for prices only; the cloud executor (bot/cloud_effects.py) acts on it
        self.policy = policy
        self.recipes = dict(recipes)
        self.clock = clock
        self.oncall = oncall or OnCall()
        self._views: dict[tuple[str, int], tuple[float, SpotView]] = {}
        self.rate = RateLimiter(store.redis, store.keys, clock)  # per user, shared by every replica
        self.series = ChartSeries(store.redis, store.keys)  # the chart's points, from the progress accepted
        self._quiet = LimitedLog(log)  # a flood of refusals or of one user's commands: bounded lines

    # -- chat commands ------------------------------------------------------------------------------------

    async def command(self, user: str, chat: ChatRef, text: str, lang: Lang = "en") -> str:
        """Answer one ``/finetune`` command from ``user`` in ``chat`` (typed, or a card's button: the same checks),
        in ``lang``; the reply goes back to the caller only. Past the user's rate nothing runs; a refusal
        (:mod:`handlers.permissions`) is one sentence, recorded apart from actions, and changes nothing."""
        slow = await self._rate(user, "commands", self.policy.rate.commands_per_minute, lang)
        if slow is not None:
            return slow
        try:
            command = parse(text)
        except ReasonError as exc:
            return say(lang, exc.reason)
        refused = narrowed(self.policy, user, command.action)
        if refused is not None:
            return await self._refuse(user, chat, command, refused, lang)
        if command.action == "help":
            return say(lang, HELP_REASON) + "\n\n" + recipes_text(self.recipes.values(), lang)
        if command.action == "list" or (command.action == "status" and command.job_id is None):
            return await self._list(user, chat, lang)
        if command.action == "start":
            return await self._start(user, chat, command, lang)
        if command.action == "costs":
            return await self._costs(user, chat, command, lang)
        if command.action in ("status", "logs", "history", "chart"):
            return await self._read(user, chat, command, lang)
        return await self._job_command(user, chat, command, lang)

    def answers_privately(self, user: str, text: str) -> bool:
        """Whether the answer to ``user``'s ``text`` is for them alone (:mod:`handlers.private_answers`): a chat
        that would show it to a whole group sends it to the asker one to one instead, or refuses it there."""
        return answered_privately(self.policy, user, text)

    async def _rate(self, user: str, bucket: Bucket, per_minute: int, lang: Lang) -> str | None:
        """The slow-down answer when ``user``'s bucket is empty (nothing runs), else None (a token was taken)."""
        wait = await self.rate.take(bucket, user, per_minute)
        if wait is None:
            return None
        self._quiet.warning("rate", "slowed %s down: over %d %s a minute", user, per_minute, bucket)
        return catalog.text(lang, f"reply.slow-down.{bucket}", limit=per_minute, wait=max(1, math.ceil(wait)))

    async def _start(self, user: str, chat: ChatRef, command: Command, lang: Lang) -> str:
        assert command.recipe is not None
        raw_options, overrides = split_overrides(command.overrides)  # deadline=, budget=: the job's, not the recipe's
        now = self.clock()  # the deadline counts from the job's creation
        try:
            options = parse_job_options(raw_options, now)
            recipe = find_recipe(command.recipe, self.recipes)
            reserved = reserved_parameter(recipe.name, recipe.parameters)
            if reserved is not None:
                raise reserved
            params = recipe.resolve(overrides)
        except ReasonError as exc:
            return catalog.text(lang, "reply.refused", why=say(lang, exc.reason))
        slow = await self._rate(user, "starts", self.policy.rate.starts_per_minute, lang)  # a start that could run
        if slow is not None:
            return slow
        team = home_team(self.policy, user, chat)
        caps = caps_for(self.policy, recipe.max_nodes, team, user)
        blocked = nodes_refusal(caps, recipe.name, options.nodes)
        if blocked is None:  # the cloud is asked for a price only for a job of a size allowed
            price = await self._hourly_price(caps, recipe, "spot", options.nodes)
            blocked = price_refusal(caps, price, options.nodes)
        if blocked is not None:
            return await self._refuse(user, chat, command, blocked, lang)
        steered = steers(self.policy.spot.name, options.deadline, options.budget)
        spot = await self._spot_view(recipe, options.nodes) if steered else None  # asked only for a steered job
        for _ in range(20):
            total = recipe.total_steps(params)
            change = new_job(
                new_job_id(),
                recipe.name,
                dict(params),
                user,
                chat,
                now,
                total,
                deadline=options.deadline,
                budget=options.budget,
                spot_policy=self.policy.spot.name,
                spot=spot,
                team=team,
                nodes=options.nodes,
                efa=options.efa,
            )
            try:  # the node caps are counted in the write itself: concurrent starts never pass one together
                created = await self.store.create(change.job, change.history, change.outbox, caps=caps)
            except JobCapReached as exc:
                full = await self._full(caps, exc.full, change.job)
                return await self._refuse(user, chat, command, full, lang)
            if created:
                await self._audit(user, chat, "start", change.job.id)
                words = {**{key: str(value) for key, value in params.items()}, **raw_options}
                shown = " ".join(f"{key}={value}" for key, value in words.items())
                return catalog.text(lang, "reply.starting", job=change.job.id, recipe=recipe.name, params=shown)
        raise RuntimeError("could not find a free job id")

    async def _job_command(self, user: str, chat: ChatRef, command: Command, lang: Lang) -> str:
        assert command.job_id is not None
        now = self.clock()
        spot = None
        price = None
        if command.action == "resume":  # the spot policy chooses where a steered job resumes
            found = await self.store.get(command.job_id)
            spot = await self._spot_view_of(found) if found is not None else None
            if found is not None:  # a resume passes the caps a start passes, on the market it asks for
                market: Market = "on-demand" if command.on_demand else "spot"
                recipe = self.recipes.get(found.recipe)
                price = await self._hourly_price(self._caps_of(found), recipe, market, found.nodes)
        refusals: list[Reason] = []

        def change(job: Job) -> Change | None:
            # Checked on the job as it is written (a page opened or closed meanwhile counts), in the same step.
            refused = job_refusal(self.policy, self.oncall, user, chat, command.action, job, now)
            if refused is None and command.action == "resume" and next_state(job.state, "resume") is not None:
                refused = self._resume_refusal(job, price)
            refusals[:] = [refused] if refused is not None else []
            if refused is not None:
                return None
            if command.action == "stop":
                return stop_command(job, user, now, self.policy.lifecycle)
            if command.action == "interrupt-test":
                return interrupt_test_command(job, user, now, command.node)
            if command.action == "ack":
                return ack_command(job, user, now)
            return resume_command(job, user, command.on_demand, now, spot)

        # A resume's nodes are counted in the write itself, as a start's are; nothing else is ever refused for the
        # caps (a stop, an ack or a drill of a job over a cap an admin lowered since must still go through).
        counted = self._caps_of if command.action == "resume" else None
        try:
            applied = await self.store.apply(command.job_id, change, caps=counted)
        except JobCapReached as exc:
            job = await self.store.get(command.job_id)
            assert job is not None
            full = await self._full(self._caps_of(job), exc.full, job)
            return await self._refuse(user, chat, command, full, lang)
        if applied.missing:
            return catalog.text(lang, "reply.no-job", job=command.job_id)
        if refusals:
            return await self._refuse(user, chat, command, refusals[0], lang)
        assert applied.change is not None
        done = applied.change
        if done.history.get("event") == "ignored":
            why = say(lang, done.reason) if done.reason is not None else str(done.history["why"])
            return catalog.text(lang, "reply.ignored", action=command.action, job=command.job_id, why=why)
        await self._audit(user, chat, command.action, command.job_id)
        state = catalog.text(lang, f"state.{done.job.state.value}")
        return catalog.text(lang, "reply.ok", action=command.action, job=command.job_id, state=state)

    def _caps_of(self, job: Job) -> Caps:
        """The caps in force for ``job`` now (its recipe's max_nodes, its team's overrides)."""
        recipe = self.recipes.get(job.recipe)
        return caps_for(self.policy, recipe.max_nodes if recipe is not None else 1, job.team, job.requested_by)

    def _resume_refusal(self, job: Job, price: float | None) -> Reason | None:
        """Why ``job`` may not resume under the caps of a start (its nodes, its price on the market asked), or None;
        the concurrency caps are counted by the write."""
        caps = self._caps_of(job)
        return nodes_refusal(caps, job.recipe, job.nodes) or price_refusal(caps, price, job.nodes)

    async def _hourly_price(self, caps: Caps, recipe: Recipe | None, market: Market, nodes: int) -> float | None:
        """What a job of ``nodes`` nodes of ``recipe`` costs an hour on ``market`` (every node of a gang bills);
        asked of the cloud only when a price cap is in force. None: not known."""
        if caps.max_hourly_price is None or recipe is None:
            return None
        price = await self.cloud.hourly_price(recipe.instance_types.get(self.cloud.name, []), market)
        return price * nodes if price is not None else None

    async def _full(self, caps: Caps, full: Full, job: Job) -> Reason:
        """The words for a node cap ``job`` would pass, with the nodes running now (its own not counted)."""
        group, total = await self.store.active_nodes(caps.group, except_job=job.id)
        return concurrency_refusal(caps, full, group if full == "group" else total, job.nodes)

    async def tool_ack(self, key: str, tool: Tool, who: str, event_id: str) -> str:
        """An acknowledgement made in a paging tool (its webhook, authenticated): the page ``key`` names is
        acknowledged in chat too, unless it is acknowledged already or is not the job's open page (nothing
        changes then). ``event_id`` (the tool's) makes a redelivered webhook cost one read. Says what happened."""
        named = parse_page_key(key)
        if named is None:
            return "not-ours"
        job_id, attempt = named
        now = self.clock()

        def change(job: Job) -> Change | None:
            page = job.page
            if page is None or page.attempt != attempt or page.acked_by:
                return None  # closed, another page, or acknowledged already: nothing to change
            return ack_command(job, f"{tool}:{who}", now, via=tool)

        applied = await self.store.apply(job_id, change, dedup_key=event_id)
        if applied.missing:
            return "no-job"
        if applied.duplicate:
            return "duplicate"
        return "acked" if applied.change is not None else "nothing-to-ack"

    async def _list(self, user: str, chat: ChatRef, lang: Lang) -> str:
        """The channel's latest jobs (an admin's: every channel's), read from the store's index, not every job."""
        jobs = await self.store.recent(None if is_admin(self.policy, user) else chat, count=LIST_LENGTH)
        if not jobs:
            return catalog.text(lang, "reply.no-jobs")
        return "\n".join(
            catalog.text(
                lang,
                "reply.list-line",
                job=job.id,
                state=catalog.text(lang, f"state.{job.state.value}"),
                recipe=job.recipe,
                step=job.step or 0,
                total=job.total_steps or "?",
            )
            for job in jobs
        )

    async def _costs(self, user: str, chat: ChatRef, command: Command, lang: Lang) -> str:
        """The spend report a person may see (:func:`handlers.permissions.cost_refusal`), in words, to them; and,
        when it has jobs and the channel may see it (:func:`handlers.permissions.channel_sees_costs`), its bar chart
        for the channel: a :class:`CostsChart` on the chat outbox (durable, retried, posted once, where the
        platform posts images), which reads the same report again and draws it."""
        refused = cost_refusal(self.policy, user, command.team)
        if refused is not None:
            return await self._refuse(user, chat, command, refused, lang)
        teams = cost_teams(self.policy, user, command.team)
        end = self.clock()
        report = await read_costs(self.store, command.window, end, teams)
        if report.jobs and channel_sees_costs(self.policy, chat, report.teams):
            chart = CostsChart(chat=chat, window=command.window, end=end, teams=report.teams, by=user)
            await self.store.send([chart], chat.platform)
        return costs_text(report, lang)

    async def _read(self, user: str, chat: ChatRef, command: Command, lang: Lang) -> str:
        assert command.job_id is not None
        job = await self.store.get(command.job_id)
        if job is None:
            return catalog.text(lang, "reply.no-job", job=command.job_id)
        refused = job_refusal(self.policy, self.oncall, user, chat, command.action, job, self.clock())
        if refused is not None:
            return await self._refuse(user, chat, command, refused, lang)
        if command.action == "status":
            return card_text(job, self.clock(), lang)
        if command.action == "chart":  # drawn and posted in the job's thread by the chat outbox, as any note
            chart = Notify(job_id=job.id, channel="thread", note=ChartNote(occasion="asked", by=user))
            platform = job.chat.platform if job.chat is not None else ""
            await self.store.send([chart], platform)
            on_console = platform in ("", "console")  # the console writes it to a file and says where
            return catalog.text(lang, "reply.chart-file" if on_console else "reply.chart", job=job.id)
        if command.action == "logs":
            return await self._trainer_log(job, lang)
        # The history is the operators' record: its lines stay as written (English), whatever the channel reads.
        entries = await self.store.history(job.id, count=30, with_times=True)
        return "\n".join(
            f"{entry['written']:%Y-%m-%d %H:%M:%S} {entry.get('event')} "
            + " ".join(f"{k}={v}" for k, v in entry.items() if k not in ("event", "written"))
            for entry in entries
        )

    async def _trainer_log(self, job: Job, lang: Lang) -> str:
        """The tail of the trainer's log of the job's latest attempt that wrote one, where the cloud lets the bot
        read it; each line cleaned as any text from outside (no escape, no mention marker)."""
        history = f"/finetune history {job.id}"
        if not isinstance(self.cloud, ReadsTrainerLogs):
            return catalog.text(lang, "reply.logs-elsewhere", job=job.id, cloud=self.cloud.name, history=history)
        for attempt in reversed(job.attempts):
            lines = await self.cloud.trainer_log(job.id, attempt.number, LOG_LINES)
            if lines is not None:
                head = catalog.text(lang, "reply.logs", job=job.id, attempt=attempt.number, count=len(lines))
                return "\n".join([head, *(clean_line(line)[:LOG_LINE_LENGTH] for line in lines)])
        return catalog.text(lang, "reply.no-logs", job=job.id, history=history)

    async def _refuse(self, user: str, chat: ChatRef, command: Command, why: Reason, lang: Lang) -> str:
        """Record the refusal (apart from the actions) and answer it in one sentence; nothing else happens."""
        self._quiet.warning("refused", "refused %s of %s from %s: %s", command.action, command.job_id, user, why)
        entry: dict[str, Any] = {"event": "refused", "action": command.action, "by": user}
        if command.job_id is not None:
            entry["job"] = command.job_id
        await self.store.refused({**entry, "channel": channel_id(chat), "why": str(why)})
        return catalog.text(lang, "reply.refused", why=say(lang, why))

    async def _audit(self, user: str, chat: ChatRef, action: str, job_id: str) -> None:
        """A command carried out, in the audit stream (the job's own history has the detail)."""
        await self.store.audit({"event": action, "by": user, "job": job_id, "channel": channel_id(chat)})

    # -- the bus ------------------------------------------------------------------------------------------

    async def handle(self, raw: dict[str, Any]) -> None:
        """Handle one events-stream message; raising leaves it pending for a retry (and parking after too many)."""
        message = _parsed(raw)
        if message is not None:
            await self._message(message)

    async def handle_many(self, raws: Sequence[dict[str, Any]]) -> None:
        """Handle messages of one bus lane, in stream order: each run of plain inputs about one job is applied in
        one store write (:meth:`JobStore.apply_many`), anything else as :meth:`handle` does it."""
        run: list[BusMessage] = []
        run_job: str | None = None
        for raw in raws:
            message = _parsed(raw)
            if message is None:
                continue
            job_id = self._plain_input_job(message)
            if run and job_id != run_job:
                await self._inputs(run_job, run)
                run = []
            if job_id is None:
                await self._message(message)
                continue
            run.append(message)
            run_job = job_id
        if run:
            await self._inputs(run_job, run)

    async def _message(self, message: BusMessage) -> None:
        if isinstance(message, (*CLOUD_EFFECTS, Notify)):  # every effect goes to its executor's queue, never here
            log.error("dropped a %s message %s on the events stream: an effect, not an input", message.type, message.id)
            return
        if isinstance(message, TIMERS) and message.due > self.clock():
            await self.store.send([message])  # not due yet (another replica's clock): back into the timer set
            return
        await self._input(message)

    def _plain_input_job(self, message: BusMessage) -> str | None:
        """The job of an input that needs nothing but its job to be decided (no spot view, no lookup, no timer
        put back), so it can join a run of that job's inputs; None for any other message."""
        if isinstance(message, (*CLOUD_EFFECTS, Notify, *TIMERS)) or _asks_policy(message):
            return None
        report = getattr(message, "report", None)
        if report is not None:
            return str(report.job_id)
        job_id = getattr(message, "job_id", None)
        return job_id if isinstance(job_id, str) else None

    async def _input(self, message: BusMessage) -> None:
        job_id = await self._job_of(message)
        if job_id is None:
            log.info("no job for %s %s; ignored", message.type, message.id)
            return
        spot = None
        if _asks_policy(message):
            job = await self.store.get(job_id)
            spot = await self._spot_view_of(job) if job is not None else None
        applied = await self.store.apply(
            job_id, self._decider(message, spot), Keys.input_seen(message.id), _remembered_for([message])
        )
        await self._charted(job_id, [await self._applied(job_id, message, applied)])

    async def _inputs(self, job_id: str | None, messages: Sequence[BusMessage]) -> None:
        """A run of plain inputs of one job: decided one after the other, written at once (the job, then the
        chart points of the run's progress)."""
        assert job_id is not None
        if len(messages) == 1:
            await self._input(messages[0])
            return
        steps = [(self._decider(message, None), Keys.input_seen(message.id)) for message in messages]
        points = [
            await self._applied(job_id, message, applied)
            for message, applied in zip(
                messages, await self.store.apply_many(job_id, steps, _remembered_for(messages)), strict=True
            )
        ]
        await self._charted(job_id, points)

    def _decider(self, message: BusMessage, spot: SpotView | None) -> Callable[[Job], Change | None]:
        return lambda job: decide(job, message, self.clock(), self.oncall, self.policy.lifecycle, spot)

    async def _applied(self, job_id: str, message: BusMessage, applied: Applied) -> Point | None:
        """What follows an input once it is written: a refused runner claim is logged, a first step measured; a
        progress report that moved the job gives its chart point (fenced or ignored ones do not)."""
        noted = applied.change.history if applied.change is not None else {}
        if noted.get("event") == "ignored" and noted.get("what") == "report:started":  # a runner's claim refused
            log.warning("%s: %s ignored: %s", job_id, noted["what"], noted.get("why"))
        report = getattr(message, "report", None)
        if not isinstance(report, Progress):
            return None
        if applied.job is not None and first_step_was(applied.job, report.time):
            await self.store.record_restart(applied.job)  # the attempt's restart overhead, for the next jobs
        if noted.get("event") != "progress":
            return None
        return Point(report.step, report.loss, report.time, report.attempt)

    async def _charted(self, job_id: str, points: Sequence[Point | None]) -> None:
        """Keep the chart points of inputs just written, in one round trip (a script call per event was most of
        the bus's Redis commands). A crash between the job's write and this one leaves those points off the
        chart, as it did when each was written alone: the job record has their steps."""
        await self.series.add_many(job_id, [point for point in points if point is not None])

    # -- the spot policy's view of the cloud ----------------------------------------------------------------

    async def _spot_view_of(self, job: Job) -> SpotView | None:
        if not managed(job):
            return None
        recipe = self.recipes.get(job.recipe)
        return await self._spot_view(recipe, job.nodes) if recipe is not None else None

    async def _spot_view(self, recipe: Recipe, nodes: int) -> SpotView:
        """Zones and prices now, for the recipe's instance types and a job of ``nodes`` instances (read at most once
        a minute: a policy tick or an interruption does not cost a price lookup each). A cloud that cannot say
        leaves the part unknown."""
        cached = self._views.get((recipe.name, nodes))
        if cached is not None and time.monotonic() - cached[0] < SPOT_VIEW_SECONDS:
            return cached[1]
        types = recipe.instance_types.get(self.cloud.name, [])
        zones: tuple[str, ...] = ("",)
        scores: dict[str, float] = {}
        try:
            if isinstance(self.cloud, ListsZones):
                zones = tuple(await self.cloud.spot_zones(types)) or ("",)
            if isinstance(self.cloud, ReadsAvailability):  # live availability, where the cloud says it
                scores = await self.cloud.zone_availability(types, nodes)
            spot_price = await self.cloud.hourly_price(types, "spot")
            on_demand_price = await self.cloud.hourly_price(types, "on-demand")
        except CloudError as exc:  # a cloud API that fails now: the policy plans with what is known
            log.warning("spot policy: the cloud did not say zones or prices (%s)", exc)
            spot_price = on_demand_price = None
        view = SpotView(
            zones=zones,
            spot_price=spot_price,
            on_demand_price=on_demand_price,
            period=timedelta(seconds=self.policy.spot.tick_seconds),
            scores=scores,
            restart_s=await self.store.restart_estimate(recipe.name, types, nodes),
            launches_ahead=launches_ahead(self.cloud),
            regions=spans_regions(self.cloud, self.policy.spot.cross_region_gb_per_s),
        )
        self._views[(recipe.name, nodes)] = (time.monotonic(), view)
        return view

    async def _job_of(self, message: BusMessage) -> str | None:
        if isinstance(message, CloudEvent):  # the bus found its job as it took it, when the job was known then
            return message.job_id or await self.store.job_for_instance(message.instance_id)
        report = getattr(message, "report", None)
        if report is not None:
            return str(report.job_id)
        return getattr(message, "job_id", None)


def spans_regions(cloud: CloudProvider, cross_region_gb_per_s: float) -> Regions | None:
    """What a move out of the cloud's home region (its bucket's) costs, where the cloud spans regions (its
    ``home_region`` and ``transfer_price_per_gb``, bot/cloud/base.py's ``SpansRegions``); None: one region."""
    if not isinstance(cloud, SpansRegions) or not cloud.home_region:
        return None
    home, price = cloud.home_region, cloud.transfer_price_per_gb
    return Regions(home, float(price), cross_region_gb_per_s * 1e9)


def _parsed(raw: dict[str, Any]) -> BusMessage | None:
    """The message of an events-stream entry (the one edge where a stored message becomes a model); None, logged,
    for one that is malformed (no retry can fix it)."""
    try:
        return parse_message(raw)
    except ValidationError as exc:
        log.error("dropped a malformed bus message %s: %s", raw.get("id"), exc.errors()[:3])
        return None


def _remembered_for(messages: Sequence[BusMessage]) -> int:
    """How long the inputs' seen-marks live: a runner report's outlives every delivery of it that a queue can
    still make and the bot would take (:data:`handlers.report_freshness.REPORT_SEEN_SECONDS`), so a report
    delivered again, however late, is applied once; any other input's, the store's default."""
    return REPORT_SEEN_SECONDS if any(isinstance(message, ReportReceived) for message in messages) else DEDUP_TTL


def _asks_policy(message: BusMessage) -> bool:
    """Inputs on which a steered job's spot policy may be asked: the instance lost, a launch refused, a runner
    failure that relaunches, the start that did not come, the policy's own tick, an early signal (a move ahead of
    it) and a spot warning (one before the runner started relaunches at once)."""
    if isinstance(message, ReportReceived):
        report = message.report
        return isinstance(report, Interrupted | Failed) or (isinstance(report, Notice) and report.kind != "stop")
    if isinstance(message, CloudEvent):
        return True
    return isinstance(message, LaunchFailed | PolicyTick | StartDeadline)

"""English: the bot's original wording, kept word for word (tests and the demo compare it).

What the handlers say (usage errors, refusals, guards, recipe errors, why a command changed nothing) is their
own English, taken from the tables next to the code that says it, so the two can never differ.
"""

from __future__ import annotations

from handlers import (
    caps,
    commands,
    decide,
    failures,
    job_options,
    permissions,
    policy_reasons,
    recipes,
    reconcile,
)

HANDLERS: dict[str, str] = {
    **commands.WORDING.sentences,
    **caps.WORDING.sentences,
    **permissions.WORDING.sentences,
    **recipes.WORDING.sentences,
    **decide.WORDING.sentences,
    **job_options.WORDING.sentences,
    **policy_reasons.WORDING.sentences,
    **reconcile.WORDING.sentences,
    **failures.WORDING.sentences,
}

BOT: dict[str, str] = {
    # The job card.
    # The job's chart (bot/charts/render.py): drawn words, and the message posted with it.
    "chart.title": "{job} · {recipe}: loss and cost",
    "chart.step": "step",
    "chart.loss": "loss",
    "chart.cost": "cost so far ($)",
    "chart.interrupted": "interrupted",
    "chart.resumed": "resumed",
    "card.title": "{job} · {recipe}",
    "label.state": "State",
    "label.instance": "Instance",
    "label.standby": "Next instance",
    "label.price": "Price",
    "label.nodes": "Nodes",
    "label.node": "Node {rank}",
    "label.step": "Step",
    "label.eta": "ETA",
    "label.cost": "Cost",
    "label.checkpoint": "Checkpoint",
    "label.notice-budget": "Notice budget",
    "label.interruptions": "Interruptions",
    "label.problem": "Problem",
    "label.on-call": "On-call",
    "label.plan": "Plan",
    "label.deadline": "Deadline",
    "label.budget": "Budget",
    "state.PENDING": "PENDING",
    "state.PROVISIONING": "PROVISIONING",
    "state.RUNNING": "RUNNING",
    "state.INTERRUPTED": "INTERRUPTED",
    "state.RECOVERING": "RECOVERING",
    "state.STOPPING": "STOPPING",
    "state.STOPPED": "STOPPED",
    "state.SUCCEEDED": "SUCCEEDED",
    "state.FAILED": "FAILED",
    "state.RESUME_FAILED": "RESUME_FAILED",
    "market.spot": "spot",
    "market.on-demand": "on-demand",
    "card.instance": "{where} ({market}, attempt {attempt})",
    "card.launching": "launching…",
    "card.standby": "{where} ({market}), launched ahead: the job moves there once it is up",
    "card.gang": "{nodes} instances in {zone} (generation {generation})",
    "card.price": "${price:.2f}/h",
    "card.loss": " · loss {loss:.4f}",
    "card.progress": "{bar} {percent:.0%} · {steps}",
    "card.eta.hours": "{hours:.1f} h",
    "card.eta.minutes": "{minutes:.0f} min",
    "card.eta.seconds": "{seconds:.0f}s",
    "card.cost": "${paid:.4f}{egress}{saving}",
    "card.egress": " · egress ${egress:.4f}",
    "card.saving": " · saving {savings:.0%} vs on-demand",
    "card.checkpoint": "step {step} · {uri}",
    "card.notice-budget": "commit ~{commit}s of {notice}s",
    "card.notice-budget.short": (
        "commit ~{commit}s of {notice}s: does not fit, a notice loses the work since the last save"
    ),
    "card.interruptions": "{count} · {lost} · {downtime:.0f}s downtime",
    "lost.count": "{lost} steps lost",
    "lost.unknown": "steps lost: unknown",
    "lost.at-least": "at least {lost} steps lost (and an unknown number)",
    "card.acked": "acknowledged by {by} at {at}",
    "card.paged": "paged {sent} time(s), not acknowledged yet",
    "card.plan": "{reason}{projection}",
    "card.plan.projection": " · projected finish {finish:%Y-%m-%d %H:%M} UTC, cost ${cost:.2f}",
    "card.plan.cost": " · projected cost at most ${cost:.2f}",
    "card.deadline": "{at:%Y-%m-%d %H:%M} UTC",
    "card.budget": "${budget:.2f}",
    "button.ack": "Acknowledge",
    "button.stop": "Stop",
    "button.resume": "Resume",
    "button.on-demand": "On-demand",
    # Times and lists inside sentences.
    "time.format": "%H:%M:%S UTC",
    "time.unknown": "an unknown time",
    "list.separator": ", ",
    "timing.item": "{name} {seconds:.1f}s",
    "phase.save": "save",
    "phase.upload": "upload",
    "phase.total": "total",
    # Thread messages, alerts and pages, by note type.
    "note.instance-in-zone": "{instance} in {zone}",
    "note.interruption-warning": (
        "⚠️ Spot interruption warning for {job} on {instance} (from {source}); "
        "the machine goes at {deadline}. Checkpointing now."
    ),
    "note.interrupted.saved": "💾 Checkpoint at step {step} saved before the deadline ({timing}). Relaunching…",
    "note.interrupted.late": (
        "💾 Work after step {step} NOT saved in time ({cause}) ({timing}){lost}. "
        "Relaunching from the checkpoint at step {step}…"
    ),
    "note.interrupted.nothing": (
        "💾 No checkpoint yet: nothing was saved in time ({cause}) ({timing}){lost}. Relaunching from the start…"
    ),
    "note.interrupted.lost": ": {lost} steps lost (the trainer had reached step {reached})",
    "note.interrupted.lost-unknown": "; steps lost: unknown (the trainer's step was not seen)",
    # Why the newest work of an interrupted attempt did not make it (the runner's codes).
    "late.unknown": "the runner did not say why",
    "late.upload-failed": "upload failed before the deadline: {error}",
    "late.not-asked": "no fresh save asked for: {why}",
    "late.why.already-saving": "the trainer was already saving checkpoint-{step}",
    "late.why.no-rate": "no upload rate measured yet",
    "late.why.too-slow": "a fresh save needed ~{need:.0f}s; {left:.0f}s were left",
    "late.why.trainer-exited": "the trainer had already exited",
    "late.not-saved": "the trainer did not save a checkpoint in time",
    "late.trainer-gone": "the trainer exited without saving a checkpoint",
    "late.not-uploaded": "the fresh checkpoint-{step} did not finish uploading before the deadline",
    "note.resumed": (
        "🔁 Resumed on attempt {attempt} in {zone} {start}: {lost}, {downtime:.0f}s downtime{skipped}."
    ),
    "note.resumed.new-zone": "a new zone",
    "note.resumed.from-step": "from step {step}",
    "note.resumed.from-start": "from the start (no checkpoint yet)",
    "note.resumed.skipped": "; skipped {count} invalid checkpoint(s)",
    "note.completed": (
        "✅ {job} finished: {attempts} attempt(s), {interruptions} interruption(s), {lost}, "
        "{downtime:.0f}s downtime, cost ${paid:.4f}{saving}. Output: {output}"
    ),
    "note.completed.saving": ", saved {savings:.0%} against on-demand",
    "note.failed": "❌ {job} failed: {reason}",
    "note.resume-failed": (
        "🚨 On-call{again}: {job} could not resume ({reason}). "
        "Reply `/finetune ack {job}`, then `resume {job}` or `resume {job} on-demand`, or `stop {job}`."
    ),
    "note.resume-failed.again": " (escalation {number} of {steps}, not acknowledged yet)",
    "note.interrupt-test-started": "🧪 Interrupt test on {instance} started by {by}.",
    "note.stop-requested": "⏹️ Stop requested by {by}: checkpointing, then releasing the instance.",
    "note.chart": "📈 {job}: loss and cost, step {progress}, {interruptions} interruption(s), ${paid:.4f} in all",
    "note.stopped": "⏹️ {job} stopped.",
    "note.stopped.kept": "⏹️ {job} stopped; checkpoint at step {step} kept.",
    "note.acked": "👀 {by} acknowledged the page for {job} at {at}; the escalation stops.",
    "note.acked.via": "👀 {by} acknowledged the page for {job} in {tool} at {at}; the escalation stops.",
    # The summary of a page in PagerDuty / Opsgenie (the tool shows it; the chat never posts a pager call).
    "note.pager-call.trigger": "finetune: job {job} could not resume ({reason})",
    "note.pager-call.acknowledge": "finetune: job {job} acknowledged by {by}",
    "note.pager-call.resolve": "finetune: job {job} resumed or stopped",
    "note.resume-requested": "🔁 {by} asked to resume {job} on {market}.",
    "note.rebalance": "↔️ Rebalance recommendation: the instance is at elevated risk; checkpointing early.",
    "note.rebalance-checkpoint": "💾 Early checkpoint at step {step} committed in {seconds:.1f}s.",
    "note.notice-budget": (
        "⏱️ A commit on a spot notice would take ~{commit}s ({save}s to save, then {mib:.1f} MiB at {rate}), longer "
        "than the cloud's {notice}s notice: a notice will lose the work since the last periodic save. Save smaller "
        "checkpoints, or more often; the spot policy counts the risk."
    ),
    "note.notice-budget.rate": "{mib_per_second:.1f} MiB/s",
    "note.notice-budget.no-rate": "an unmeasured rate",
    "note.scheduled-event": (
        "🛠️ Scheduled system event {event} for the instance (not before {due}); checkpointing early, training on."
    ),
    "note.early.ahead": (
        " Moving ahead of it: a replacement instance launches now and takes over from a fresh checkpoint once it is "
        "up (~{left:.0f} min of training left; a restart costs ~{restart:.0f} min)."
    ),
    "note.early.short": (
        " Staying: ~{left:.0f} min of training left is too little to pay for a move "
        "(a restart costs ~{restart:.0f} min)."
    ),
    "note.warned-before-start": (
        "⚠️ Spot interruption warning for {instance} (from {source}) before its runner started: it will not live to "
        "train. Released; relaunching now."
    ),
    "note.spot-policy": "🧭 {reason}",
    "note.instance-gone": ("⚠️ Instance {instance} went away without notice; relaunching from the last checkpoint."),
    "note.held-step": "💾 Node {node} committed step {step}, the step the survivors held, for the gang: {rebuilt}.",
    "note.held-step.derived": "node {node}'s RNG and data order rebuilt from (seed, step, rank)",
    "note.held-step.from-part": "node {node}'s own state taken from its part of checkpoint-{step}",
    "note.instance-released": "🧹 Released instance {instance}: {why}.",
    "note.group-released": "🧹 Set scaling group {group} to 0: {why}.",
    "note.no-reports": "🔇 No report from {job} for {minutes} min, while the cloud lists {instance} as running.",
    "note.relaunch-paused": (
        "⏳ Attempt {attempt} ended without progress ({count} in a row; the job ends after {limit}). "
        "Relaunching in {seconds:g}s."
    ),
    "note.hung": (
        "🧊 The trainer hung at step {step}: no step for {seconds:.0f}s (its limit {limit:.0f}s). {then}{frames}"
    ),
    "note.hung.restart": "Ended it; training again from the checkpoint of step {step}.",
    "note.hung.restart-start": "Ended it; training again from the start.",
    "note.hung.relaunch": "Its second hang on this instance: relaunching on another.",
    "note.hung.regroup": "Ended it; the gang starts again from its newest checkpoint.",
    "note.hung.frames": "\nWhere it hung (innermost first):",
    "note.hung.frame": "\n    {function} ({file}:{line})",
    "note.hung.no-stacks": "\nNo stack could be taken (see the runner's log).",
    "note.interrupt-test-failed": "⚠️ interrupt-test failed for {job}: {error}",
    "note.interrupt-test-done.fis": (
        "ℹ️ FIS experiment {reference} started: a spot interruption notice for {instance}, "
        "interrupted {seconds:.0f}s after it"
    ),
    "note.interrupt-test-done.notice": "ℹ️ spot interruption notice posted on {instance}; it is reclaimed at {at}",
    # Message titles (the notification preview) and what the chat adapters say themselves.
    "title.reply": "finetune",
    "title.card": "{job} · {recipe}",
    "title.thread": "{job}",
    "title.alert": "Spot alert · {job}",
    "title.page": "On-call · {job}",
    "chat.not-text": "I only read text commands: `@bot /finetune help`",
    "chat.unknown-button": "This button is not one of the bot's ({action}).",
    "chat.failed": "Something went wrong on the bot's side; check `/finetune status` before trying again.",
    "chat.unknown-card": "This card does not belong to a job of the bot.",
    "chat.starting": "The bot is still starting; try again in a moment.",
    "dingtalk.private-no-staff-id": (
        "Not answered here: that answer is for you alone, and DingTalk gave no staff id to send it to you privately; "
        "ask the robot in a one-to-one chat."
    ),
    "dingtalk.private-not-sent": (
        "That answer is for you alone, and DingTalk did not take it as a one-to-one message; ask the robot in a "
        "one-to-one chat."
    ),
    # The recipes part of `help`.
    "help.recipes": "Recipes (start <recipe> [key=value …]):",
    "help.recipe": "  {name} — {description}",
    "help.parameter": "      {name}={default}  {type}{range}{help}",
    "help.range": ", {low}…{high}",
    "help.choices": ", one of {choices}",
    "help.allowed": ", allowed: {forms}",
    "help.parameter-help": " — {text}",
    "help.no-parameters": "      (no parameters)",
    # Answers to commands (the reasons inside them come from the handlers, below).
    "reply.starting": "Starting {job}: {recipe} ({params})",
    "reply.ok": "OK: {action} {job} ({state})",
    "reply.chart": "📈 The chart of {job} is on its way to the job's thread.",
    "reply.chart-file": "📈 Drawing the chart of {job}: the path of its PNG file follows.",
    "console.chart-file": "the chart is in {path}",
    "reply.no-job": "no job {job}",
    "reply.logs": "📜 {job}: the last {count} line(s) of the trainer's log (attempt {attempt})",
    "reply.no-logs": "{job}: no trainer has written a log yet; {history} shows the job's history",
    "reply.logs-elsewhere": (
        "{job}: the trainer's log stays on its instance on {cloud}, out of the bot's reach; {history} shows the "
        "job's history"
    ),
    "reply.refused": "⛔ {why}",
    "reply.ignored": "⛔ {action} {job}: {why}",
    "reply.no-jobs": "no jobs yet: /finetune start tiny",
    "reply.list-line": "{job}  {state:<13} {recipe:<12} step {step}/{total}",
    "reply.slow-down.commands": "⛔ slow down: at most {limit} commands a minute; try again in {wait} s",
    "reply.slow-down.starts": "⛔ slow down: at most {limit} starts a minute; try again in {wait} s",
    # /finetune costs (bot/chat/costs.py).
    "costs.title": (
        "💰 Costs of the last {days} days ({start:%Y-%m-%d %H:%M} → {end:%Y-%m-%d %H:%M} UTC), {scope}: {jobs} jobs"
    ),
    "costs.scope.all": "every team",
    "costs.scope.teams": "team {teams}",
    "costs.none": "no job was active in this window",
    "costs.total": "Total",
    "costs.by-team": "By team:",
    "costs.by-user": "By user:",
    "costs.by-recipe": "By recipe:",
    "costs.by-zone": "By zone:",
    "costs.zone-line": "{zone}: ${paid:.2f} paid · {hours:.1f} instance-hours · {jobs} jobs",
    "costs.no-team": "(no team)",
    "costs.line": (
        "{name}: ${paid:.2f} paid{egress} · ${on_demand:.2f} on-demand · saved {saved} · {jobs} jobs · "
        "{steps_lost} steps lost · {restart_hours:.1f} h restarts"
    ),
    "costs.saved": "${saved:.2f} ({savings:.0%})",
    "costs.egress": " (egress ${egress:.2f})",
    "costs.saved-unknown": "n/a",
    "costs.chart-title": "Costs of the last {days} days by team: paid and on-demand",
    "costs.chart.paid": "paid",
    "costs.chart.on-demand": "on-demand",
    # Slack's own labels (buttons, confirmation dialogs, the card's footer, an acknowledged page).
    "slack.interrupt-test": "Interrupt-test",
    "slack.resume": "Resume",
    "slack.on-demand": "Fall back to on-demand",
    "slack.cancel": "Cancel",
    "slack.stop-title": "Stop {job}?",
    "slack.stop-text": "The job checkpoints, uploads, then its instance is released.",
    "slack.stop-yes": "Stop it",
    "slack.interrupt-test-title": "Interrupt {job}?",
    "slack.interrupt-test-text": (
        "A real spot interrupt test: the instance gets a notice and is reclaimed; the job should resume."
    ),
    "slack.interrupt-test-yes": "Interrupt",
    "slack.on-demand-title": "Resume {job} on-demand?",
    "slack.on-demand-text": "Relaunch on on-demand capacity, at the on-demand price.",
    "slack.on-demand-yes": "Resume",
    "slack.footer": "Started by {user} · updated {at:%H:%M:%S} UTC",
    "slack.acked": "✅ Acknowledged by {user} at {at:%H:%M} UTC",
    "slack.job-channel": " (job channel {channel})",
    "slack.working": "⏳ Working on it…",
    "slack.failed": "⚠️ That did not work: the bot hit an internal error (it is logged). Try again in a moment.",
    "slack.bad-button": "⛔ that button does not name a job ({value!r})",
}

MESSAGES: dict[str, str] = {**BOT, **HANDLERS}  # a test holds the two apart (no key in both)

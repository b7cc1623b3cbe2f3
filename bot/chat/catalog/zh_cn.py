"""简体中文: the same keys and placeholders as ``en.py`` (a test holds them in step)."""

from __future__ import annotations

MESSAGES: dict[str, str] = {
    # 任务图表（bot/charts/render.py）：图中文字，以及随图发送的消息。
    "chart.title": "{job} · {recipe}：损失与费用",
    "chart.step": "步数",
    "chart.loss": "损失",
    "chart.cost": "累计费用（$）",
    "chart.interrupted": "中断",
    "chart.resumed": "恢复",
    # 任务卡片
    "card.title": "{job} · {recipe}",
    "label.state": "状态",
    "label.instance": "实例",
    "label.standby": "下一实例",
    "label.price": "价格",
    "label.nodes": "节点",
    "label.node": "节点 {rank}",
    "label.step": "步数",
    "label.eta": "预计剩余",
    "label.cost": "费用",
    "label.checkpoint": "检查点",
    "label.notice-budget": "通知预算",
    "label.interruptions": "中断",
    "label.problem": "问题",
    "label.on-call": "值班",
    "label.plan": "计划",
    "label.deadline": "截止时间",
    "label.budget": "预算",
    "state.PENDING": "等待中",
    "state.PROVISIONING": "创建实例中",
    "state.RUNNING": "运行中",
    "state.INTERRUPTED": "已中断",
    "state.RECOVERING": "恢复中",
    "state.STOPPING": "停止中",
    "state.STOPPED": "已停止",
    "state.SUCCEEDED": "已完成",
    "state.FAILED": "失败",
    "state.RESUME_FAILED": "恢复失败",
    "market.spot": "抢占式",
    "market.on-demand": "按量付费",
    "card.instance": "{where}（{market}，第 {attempt} 次尝试）",
    "card.launching": "启动中…",
    "card.standby": "{where}（{market}），已提前启动：就绪后作业即迁移过去",
    "card.gang": "{zone} 中的 {nodes} 个实例（第 {generation} 代）",
    "card.price": "${price:.2f}/小时",
    "card.loss": " · 损失 {loss:.4f}",
    "card.progress": "{bar} {percent:.0%} · {steps}",
    "card.eta.hours": "{hours:.1f} 小时",
    "card.eta.minutes": "{minutes:.0f} 分钟",
    "card.eta.seconds": "{seconds:.0f} 秒",
    "card.cost": "${paid:.4f}{egress}{saving}",
    "card.egress": " · 跨区域传输 ${egress:.4f}",
    "card.saving": " · 比按量付费节省 {savings:.0%}",
    "card.checkpoint": "第 {step} 步 · {uri}",
    "card.notice-budget": "提交约 {commit} 秒 / 通知 {notice} 秒",
    "card.notice-budget.short": "提交约 {commit} 秒 / 通知 {notice} 秒：来不及，一次通知会丢失上次保存以来的训练",
    "card.interruptions": "{count} 次 · {lost} · 停机 {downtime:.0f} 秒",
    "lost.count": "丢失 {lost} 步",
    "lost.unknown": "丢失步数：未知",
    "lost.at-least": "至少丢失 {lost} 步（另有未知步数）",
    "card.acked": "已由 {by} 于 {at} 确认",
    "card.paged": "已通知 {sent} 次，尚无人确认",
    "card.plan": "{reason}{projection}",
    "card.plan.projection": " · 预计完成于 {finish:%Y-%m-%d %H:%M}（UTC），费用 ${cost:.2f}",
    "card.plan.cost": " · 预计费用至多 ${cost:.2f}",
    "card.deadline": "{at:%Y-%m-%d %H:%M}（UTC）",
    "card.budget": "${budget:.2f}",
    "button.ack": "确认",
    "button.stop": "停止",
    "button.resume": "恢复",
    "button.on-demand": "改用按量付费",
    # 句中的时间与列表
    "time.format": "%H:%M:%S（UTC）",
    "time.unknown": "未知时间",
    "list.separator": "，",
    "timing.item": "{name} {seconds:.1f} 秒",
    "phase.save": "保存",
    "phase.upload": "上传",
    "phase.total": "合计",
    # 按主题的群消息、告警与值班通知
    "note.instance-in-zone": "{instance}（{zone}）",
    "note.interruption-warning": (
        "⚠️ 任务 {job} 所在的抢占式实例 {instance} 收到中断预警（来源：{source}），"
        "将于 {deadline} 被回收。正在保存检查点。"
    ),
    "note.interrupted.saved": "💾 第 {step} 步的检查点已在回收前保存（{timing}）。正在重新启动…",
    "note.interrupted.late": (
        "💾 第 {step} 步之后的进度未能及时保存（{cause}）（{timing}）{lost}。正在从第 {step} 步的检查点重新启动…"
    ),
    "note.interrupted.nothing": (
        "💾 还没有检查点：回收前未能保存任何检查点（{cause}）（{timing}）{lost}。正在从头重新启动…"
    ),
    "note.interrupted.lost": "：丢失 {lost} 步（训练进程已到第 {reached} 步）",
    "note.interrupted.lost-unknown": "；丢失步数：未知（未能获知训练进程的步数）",
    # 中断时最新进度未能保存的原因（运行器给出的代码）
    "late.unknown": "运行器未说明原因",
    "late.upload-failed": "回收前上传失败：{error}",
    "late.not-asked": "未请求立即保存：{why}",
    "late.why.already-saving": "训练进程正在保存 checkpoint-{step}",
    "late.why.no-rate": "尚未测得上传速度",
    "late.why.too-slow": "立即保存约需 {need:.0f} 秒，只剩 {left:.0f} 秒",
    "late.why.trainer-exited": "训练进程已经退出",
    "late.not-saved": "训练进程未能及时保存检查点",
    "late.trainer-gone": "训练进程未保存检查点就退出了",
    "late.not-uploaded": "新的 checkpoint-{step} 未能在回收前上传完",
    "note.resumed": (
        "🔁 第 {attempt} 次尝试已在 {zone} {start}恢复：{lost}，停机 {downtime:.0f} 秒{skipped}。"
    ),
    "note.resumed.new-zone": "新的可用区",
    "note.resumed.from-step": "从第 {step} 步",
    "note.resumed.from-start": "从头（还没有检查点）",
    "note.resumed.skipped": "；跳过了 {count} 个无效检查点",
    "note.completed": (
        "✅ 任务 {job} 已完成：共 {attempts} 次尝试、{interruptions} 次中断，{lost}，"
        "停机 {downtime:.0f} 秒，费用 ${paid:.4f}{saving}。输出：{output}"
    ),
    "note.completed.saving": "，比按量付费节省 {savings:.0%}",
    "note.failed": "❌ 任务 {job} 失败：{reason}",
    "note.resume-failed": (
        "🚨 值班{again}：任务 {job} 无法恢复（{reason}）。"
        "请回复 `/finetune ack {job}` 认领，然后 `resume {job}` 或 `resume {job} on-demand`，或 `stop {job}`。"
    ),
    "note.resume-failed.again": "（第 {number} 级升级，共 {steps} 级，尚无人确认）",
    "note.interrupt-test-started": "🧪 {by} 在实例 {instance} 上发起了中断测试。",
    "note.stop-requested": "⏹️ {by} 请求停止：先保存检查点，再释放实例。",
    "note.chart": "📈 任务 {job}：损失与费用，第 {progress} 步，中断 {interruptions} 次，累计 ${paid:.4f}",
    "note.stopped": "⏹️ 任务 {job} 已停止。",
    "note.stopped.kept": "⏹️ 任务 {job} 已停止；保留第 {step} 步的检查点。",
    "note.acked": "👀 {by} 已于 {at} 确认任务 {job} 的值班通知，升级停止。",
    "note.acked.via": "👀 {by} 已于 {at} 在 {tool} 中确认任务 {job} 的值班通知，升级停止。",
    "note.pager-call.trigger": "finetune：任务 {job} 无法恢复（{reason}）",
    "note.pager-call.acknowledge": "finetune：任务 {job} 已由 {by} 确认",
    "note.pager-call.resolve": "finetune：任务 {job} 已恢复或停止",
    "note.resume-requested": "🔁 {by} 请求以{market}方式恢复任务 {job}。",
    "note.rebalance": "↔️ 再平衡建议：实例被回收的风险升高，提前保存检查点。",
    "note.rebalance-checkpoint": "💾 第 {step} 步的提前检查点已在 {seconds:.1f} 秒内提交。",
    "note.notice-budget": (
        "⏱️ 收到抢占通知后提交检查点约需 {commit} 秒（保存 {save} 秒，再以 {rate} 上传 {mib:.1f} MiB），"
        "超过云的 {notice} 秒通知：一次通知将丢失上次定期保存以来的训练。请减小检查点或更频繁地保存；"
        "抢占策略已计入这一风险。"
    ),
    "note.notice-budget.rate": "{mib_per_second:.1f} MiB/秒",
    "note.notice-budget.no-rate": "未测得的速率",
    "note.scheduled-event": "🛠️ 实例有计划内的系统事件 {event}（不早于 {due}）；提前保存检查点，训练继续。",
    "note.early.ahead": (
        "提前迁移：现在启动一台替代实例，待其就绪后从新的检查点接手"
        "（剩余训练约 {left:.0f} 分钟；一次重启约 {restart:.0f} 分钟）。"
    ),
    "note.early.short": "不迁移：剩余训练约 {left:.0f} 分钟，不值得为此迁移（一次重启约 {restart:.0f} 分钟）。",
    "note.warned-before-start": (
        "⚠️ 实例 {instance} 在运行器启动前收到竞价中断预警（来自 {source}）：它撑不到训练。已释放，正在重新启动。"
    ),
    "note.spot-policy": "🧭 {reason}",
    "note.instance-gone": "⚠️ 实例 {instance} 未经通知即消失；正在从最近的检查点重新启动。",
    "note.held-step": "💾 节点 {node} 把幸存节点所持有的第 {step} 步保存为整组的检查点：{rebuilt}。",
    "note.held-step.derived": "节点 {node} 的随机数状态和数据顺序由 (seed, step, rank) 重建",
    "note.held-step.from-part": "节点 {node} 自身的状态取自其在 checkpoint-{step} 中的部分",
    "note.instance-released": "🧹 已释放实例 {instance}：{why}。",
    "note.group-released": "🧹 已将伸缩组 {group} 的容量设为 0：{why}。",
    "note.no-reports": "🔇 已有 {minutes} 分钟没有收到 {job} 的报告，但云平台显示实例 {instance} 仍在运行。",
    "note.relaunch-paused": (
        "⏳ 第 {attempt} 次尝试没有进展（已连续 {count} 次；超过 {limit} 次后任务结束）。{seconds:g} 秒后重新启动。"
    ),
    "note.hung": "🧊 训练进程在第 {step} 步卡住：{seconds:.0f} 秒没有新的一步（上限 {limit:.0f} 秒）。{then}{frames}",
    "note.hung.restart": "已结束它，从第 {step} 步的检查点重新训练。",
    "note.hung.restart-start": "已结束它，从头重新训练。",
    "note.hung.relaunch": "这是它在此实例上第二次卡住：换一台实例重新启动。",
    "note.hung.regroup": "已结束它；整组节点从最新的检查点重新开始。",
    "note.hung.frames": "\n卡住的位置（最内层在前）：",
    "note.hung.frame": "\n    {function}（{file}:{line}）",
    "note.hung.no-stacks": "\n没能取得调用栈（见 runner 的日志）。",
    "note.interrupt-test-failed": "⚠️ 任务 {job} 的中断测试失败：{error}",
    "note.interrupt-test-done.fis": (
        "ℹ️ FIS 实验 {reference} 已开始：实例 {instance} 收到抢占中断通知，{seconds:.0f} 秒后被中断"
    ),
    "note.interrupt-test-done.notice": "ℹ️ 已向实例 {instance} 发出抢占中断通知；它将于 {at} 被回收",
    # 消息标题（通知预览）与聊天适配器自己的话
    "title.reply": "微调任务",
    "title.card": "{job} · {recipe}",
    "title.thread": "{job}",
    "title.alert": "抢占式实例告警 · {job}",
    "title.page": "值班告警 · {job}",
    "chat.not-text": "我只接受文字命令：`@机器人 /finetune help`",
    "chat.unknown-button": "这个按钮不属于本机器人（{action}）。",
    "chat.failed": "机器人内部出错；请先用 `/finetune status` 查看，再决定是否重试。",
    "chat.unknown-card": "这张卡片不属于本机器人的任务。",
    "chat.starting": "机器人还在启动中，请稍后再试。",
    "dingtalk.private-no-staff-id": (
        "这条回答只给你本人看，但钉钉没有给出你的 staffId，无法私聊发给你；请在与机器人的单聊中再问。"
    ),
    "dingtalk.private-not-sent": "这条回答只给你本人看，但钉钉没有接受这条单聊消息；请在与机器人的单聊中再问。",
    # 命令的回答（其中的原因来自 handlers，见下）
    "help.recipes": "配方（start <配方> [参数=值 …]）：",
    "help.recipe": "  {name} —— {description}",
    "help.parameter": "      {name}={default}  {type}{range}{help}",
    "help.range": "，{low}…{high}",
    "help.choices": "，可选 {choices}",
    "help.allowed": "，允许：{forms}",
    "help.parameter-help": " —— {text}",
    "help.no-parameters": "      （没有参数）",
    "reply.starting": "正在启动 {job}：{recipe}（{params}）",
    "reply.ok": "已受理：{action} {job}（{state}）",
    "reply.chart": "📈 任务 {job} 的图表即将发到它的消息串里。",
    "reply.chart-file": "📈 正在绘制任务 {job} 的图表：PNG 文件的路径随后给出。",
    "console.chart-file": "图表在 {path}",
    "reply.no-job": "找不到任务 {job}",
    "reply.logs": "📜 {job}：训练程序日志的最后 {count} 行（第 {attempt} 次尝试）",
    "reply.no-logs": "{job}：训练程序还没有写日志；{history} 可查看任务记录",
    "reply.logs-elsewhere": "{job}：训练程序的日志留在 {cloud} 上的实例里，机器人读不到；{history} 可查看任务记录",
    "reply.refused": "⛔ {why}",
    "reply.ignored": "⛔ {action} {job}：{why}",
    "reply.no-jobs": "还没有任务：/finetune start tiny",
    "reply.list-line": "{job}  {state}  {recipe}  第 {step}/{total} 步",
    "reply.slow-down.commands": "⛔ 请慢一点：每分钟最多 {limit} 条命令；请 {wait} 秒后再试",
    "reply.slow-down.starts": "⛔ 请慢一点：每分钟最多启动 {limit} 个任务；请 {wait} 秒后再试",
    # /finetune costs（bot/chat/costs.py）
    "costs.title": (
        "💰 最近 {days} 天的费用（{start:%Y-%m-%d %H:%M} → {end:%Y-%m-%d %H:%M} UTC），{scope}：{jobs} 个任务"
    ),
    "costs.scope.all": "全部团队",
    "costs.scope.teams": "团队 {teams}",
    "costs.none": "这段时间内没有活动的任务",
    "costs.total": "合计",
    "costs.by-team": "按团队：",
    "costs.by-user": "按用户：",
    "costs.by-recipe": "按配方：",
    "costs.by-zone": "按可用区：",
    "costs.zone-line": "{zone}：实付 ${paid:.2f} · 实例 {hours:.1f} 小时 · {jobs} 个任务",
    "costs.no-team": "（无团队）",
    "costs.line": (
        "{name}：实付 ${paid:.2f}{egress} · 按量付费需 ${on_demand:.2f} · 节省 {saved} · {jobs} 个任务 · "
        "丢失 {steps_lost} 步 · 重启耗时 {restart_hours:.1f} 小时"
    ),
    "costs.saved": "${saved:.2f}（{savings:.0%}）",
    "costs.egress": "（跨区域传输 ${egress:.2f}）",
    "costs.saved-unknown": "无法计算",
    "costs.chart-title": "最近 {days} 天各团队的费用：实付与按量付费",
    "costs.chart.paid": "实付",
    "costs.chart.on-demand": "按量付费",
    # Slack 自己的文字（按钮、确认框、卡片页脚、已确认的告警）
    "slack.interrupt-test": "中断测试",
    "slack.resume": "恢复",
    "slack.on-demand": "改用按量付费",
    "slack.cancel": "取消",
    "slack.stop-title": "停止 {job}？",
    "slack.stop-text": "任务先保存并上传检查点，然后释放实例。",
    "slack.stop-yes": "停止",
    "slack.interrupt-test-title": "中断测试 {job}？",
    "slack.interrupt-test-text": "真实的抢占中断测试：实例收到通知后被回收，任务应自动恢复。",
    "slack.interrupt-test-yes": "开始测试",
    "slack.on-demand-title": "以按量付费恢复 {job}？",
    "slack.on-demand-text": "在按量付费实例上重新启动，按按量付费价格计费。",
    "slack.on-demand-yes": "恢复",
    "slack.footer": "由 {user} 启动 · 更新于 {at:%H:%M:%S}（UTC）",
    "slack.acked": "✅ 已由 {user} 于 {at:%H:%M}（UTC）确认",
    "slack.job-channel": "（任务频道 {channel}）",
    "slack.working": "⏳ 正在处理…",
    "slack.failed": "⚠️ 操作未成功：机器人内部出错（已记录日志）。请稍后再试。",
    "slack.bad-button": "⛔ 这个按钮没有指明任务（{value!r}）",
    # 命令用法（handlers/commands.py）；命令词与 on-demand 保持英文，因为要照原样输入
    "usage.line.start": "start <配方> [参数=值 …] [deadline=36h] [budget=120] [nodes=2]",
    "usage.line.stop": "stop <任务>",
    "usage.line.interrupt-test": "interrupt-test <任务> [node=K]",
    "usage.line.status": "status [任务]",
    "usage.line.list": "list",
    "usage.line.logs": "logs <任务>",
    "usage.line.history": "history <任务>",
    "usage.line.chart": "chart <任务>",
    "usage.line.ack": "ack <任务>",
    "usage.line.resume": "resume <任务> [on-demand]",
    "usage.line.costs": "costs [7d|30d] [team=团队名]",
    "usage.line.help": "help",
    "help": (
        "/finetune {start} —— 按配方启动微调任务（配方见下），可设截止时间与预算\n"
        "/finetune {stop} —— 停止任务（先保存检查点）\n"
        "/finetune {interrupt_test} —— 中断测试\n"
        "/finetune {status} —— 查看任务状态\n"
        "/finetune {list} —— 列出最近的任务及其步数\n"
        "/finetune {logs} —— 查看训练程序日志的末尾（最近一次尝试的）\n"
        "/finetune {history} —— 查看任务记录（带时间）\n"
        "/finetune {chart} —— 在任务的消息串里发出损失与费用图\n"
        "/finetune {ack} —— 认领值班告警\n"
        "/finetune {resume} —— 从检查点继续失败或已停止的任务（可改用按量付费）\n"
        "/finetune {costs} —— 按团队、用户和配方统计花费、按量付费成本、节省、丢失步数与重启耗时\n"
        "/finetune {help} —— 显示本帮助"
    ),
    "usage.error": "{verb}：{problem}。用法：/finetune {usage}",
    "usage.too-long": "命令太长（超过 {limit} 个字符）\n{help}",
    "usage.unknown": "未知命令 {word}\n{help}",
    "usage.unknown-close": "未知命令 {word}：是不是想用 {verb}？（{help} 列出所有命令）",
    "usage.at-most-one-job": "最多只能带一个任务编号",
    "usage.resume-args": "需要一个任务编号，后面可以再加 on-demand",
    "usage.needs-recipe": "需要指定配方",
    "usage.not-recipe": "{word} 不是配方名",
    "usage.not-key-value": "{word} 不是“参数=值”的形式",
    "usage.given-twice": "参数 {key} 重复出现",
    "usage.not-job-id": "{word} 不是任务编号（任务编号形如 ft-7k2q）",
    "usage.no-arguments": "不带参数",
    "usage.one-job": "需要且只能带一个任务编号",
    "usage.costs-args": "可带一个时间窗口（7d 或 30d）和一个 team=团队名，各至多一次",
    "usage.node": "需要一个任务编号，可选 node=K（节点编号 0 到 63），而不是 {word}",
    # 权限（handlers/permissions.py）
    "refused.not-allowed": "你没有 {action} 任务的权限；请管理员把 {user} 加入 {action} 规则",
    "refused.not-yours": "你不能 {action} {job}：只有它的发起人、所属团队和管理员可以",
    "refused.not-yours-paged": "你不能 {action} {job}：只有它的发起人、所属团队、管理员和被呼叫的值班人员可以",
    "refused.other-channel": "{job} 不是本群的任务；请到启动它的群里操作",
    "refused.no-such-team": "没有名为 {team} 的团队",
    "refused.costs-not-member": "{team} 的费用只对其成员和管理员开放",
    "refused.costs-no-team": "费用只对团队成员和管理员开放；你不在任何团队中",
    # 限额（handlers/caps.py）：每条都说明是哪个上限、谁能调整；配置项名保持英文，因为要照原样写入配置
    "cap.nodes": (
        "{nodes} 个节点超过了团队 {team} 中 {recipe} 任务的上限 {limit} 个；"
        "管理员可以调高 policy.teams.{team}.max_nodes"
    ),
    "cap.nodes-no-team": (
        "{nodes} 个节点超过了 {recipe} 任务的上限 {limit} 个；管理员可以调高配方的 max_nodes，"
        "或把你加入一个 max_nodes 更高的团队"
    ),
    "cap.team-nodes": (
        "团队 {team} 正在运行 {active} 个节点（同时运行上限 {limit} 个），放不下再加的 {nodes} 个；"
        "请先停止一个任务，或请管理员调高 policy.teams.{team}.max_concurrent_nodes"
    ),
    "cap.own-nodes": (
        "你正在运行 {active} 个节点（不在任何团队中的人同时运行上限 {limit} 个），放不下再加的 {nodes} 个；"
        "请先停止一个任务，或请管理员调高 policy.max_concurrent_nodes 或把你加入一个团队"
    ),
    "cap.total-nodes": (
        "所有团队合计正在运行 {active} 个节点（同时运行上限 {limit} 个），放不下再加的 {nodes} 个；"
        "管理员可以调高 policy.max_total_nodes"
    ),
    "cap.price": (
        "{nodes} 个节点每小时 ${price:.2f}，超过了团队 {team} 的上限 ${cap:.2f}/小时；"
        "管理员可以调高 policy.teams.{team}.max_hourly_price"
    ),
    "cap.price-no-team": (
        "{nodes} 个节点每小时 ${price:.2f}，超过了上限 ${cap:.2f}/小时；管理员可以调高 policy.max_hourly_price"
    ),
    # 配方与参数（handlers/recipes.py）
    "recipe.unknown": "未知配方 {name!r}；可用的配方：{known}",
    "recipe.no-parameter": "{recipe} 没有参数 {name!r}（可用参数：{allowed}）",
    "recipe.no-parameters": "{recipe} 没有参数 {name!r}（它不接受任何参数）",
    "recipe.parameter-gone": "{recipe} 已不再有参数 {name!r}",
    "recipe.not-int": "{name} 必须是整数，而不是 {raw!r}",
    "recipe.not-float": "{name} 必须是浮点数，而不是 {raw!r}",
    "recipe.not-bool": "{name} 必须是布尔值（true 或 false），而不是 {raw!r}",
    "recipe.not-str": "{name} 必须是字符串，而不是 {raw!r}",
    "recipe.below-minimum": "{name}={value} 低于最小值 {minimum}",
    "recipe.above-maximum": "{name}={value} 超过最大值 {maximum}",
    "recipe.not-a-choice": "{name} 只能是以下之一：{choices}",
    "recipe.unsafe-text": "{name} 只能包含字母、数字和 . _ : / @ + # -",
    "recipe.option-like": "{name} 不能以 {first!r} 开头：训练程序可能把它当成命令行选项",
    "recipe.not-allowed": "{name} 不允许取 {value!r}；只能是：{forms}",
    "recipe.needs": "{name}={value} 需要 {other}={wanted}",
    # 命令为何没有生效（handlers/decide/builders.py）
    "ignored.stop": "任务当前状态为 {state}",
    "ignored.interrupt-test": "任务当前状态为 {state}，不在运行中",
    "ignored.ack": "没有需要确认的告警：任务当前状态为 {state}",
    "ignored.no-page": "没有未处理的值班告警",
    "ignored.already-acked": "已由 {by} 确认",
    "ignored.resume": "任务当前状态为 {state}；只有失败或已停止的任务才能恢复",
    "ignored.not-a-gang": "node={node} 用于多节点任务；这个任务只在一个节点上运行",
    # 任务选项 deadline 与 budget（handlers/job_options.py）；选项名保持英文，因为要照原样输入
    "option.bad-deadline": (
        "deadline 必须是时长（如 36h、90m 或 1d12h），或带时区的时间（如 2026-03-05T09:00Z），而不是 {raw!r}"
    ),
    "option.deadline-range": "deadline 必须在从现在起 10 分钟到 90 天之间，而不是 {raw!r}",
    "option.bad-budget": "budget 必须是账户币种的金额（如 120 或 99.50），而不是 {raw!r}",
    "option.budget-range": "budget 必须大于 0 且不超过 {maximum:.0f}",
    "option.reserved": "{recipe} 声明了参数 {name!r}，但 {name} 是任务选项",
    "option.bad-nodes": "nodes 必须是 1 到 {maximum} 之间的整数，而不是 {raw!r}",
    "option.bad-efa": "efa 必须是 true 或 false，而不是 {raw!r}",
    "option.efa-one-node": "efa=true 用于多节点任务：请同时给出 nodes=2 或更多",
    # 实例选择策略的当前决定及原因（handlers/spot/rules.py）
    "spot-policy.on-demand.deadline": "现在使用按量付费：还剩 {work_h:g} 小时的训练，距截止时间还有 {left_h:g} 小时",
    "spot-policy.on-demand.pace": (
        "现在使用按量付费：没有可用区有抢占式实例，剩余 {work_h:g} 小时的训练已落后于 {left_h:g} 小时内均匀完成的进度"
    ),
    "spot-policy.on-demand.reserve": (
        "现在使用按量付费：没有可用区有抢占式实例，剩下的余量（{slack_h:g} 小时）要留给之后的中断"
    ),
    "spot-policy.on-demand.only": "按量付费：此任务的策略不使用抢占式实例",
    "spot-policy.on-demand.kept": "继续使用按量付费：任务没有截止时间，无从安排改回抢占式实例",
    "spot-policy.spot": "抢占式实例（{zone}）：距截止时间还有 {slack_h:g} 小时余量",
    "spot-policy.spot.back": "改回抢占式实例（{zone}）：{slack_h:g} 小时余量足以再重启一次",
    "spot-policy.spot.only": "抢占式实例（{zone}）：此任务的策略只使用抢占式实例",
    "spot-policy.spot.no-deadline": "抢占式实例（{zone}）：任务没有截止时间",
    "spot-policy.spot.budget": "抢占式实例（{zone}）：改用按量付费会超出预算 {budget:.2f}",
    "spot-policy.wait": "等待抢占式实例：没有可用区有容量，还有 {slack_h:g} 小时余量",
    "spot-policy.wait.only": "等待抢占式实例：没有可用区有容量（此任务的策略只使用抢占式实例）",
    "spot-policy.wait.budget": "等待抢占式实例：改用按量付费会超出预算 {budget:.2f}",
    "spot-policy.late": ("已无法在截止时间前完成（还剩 {work_h:g} 小时的训练，距截止时间 {left_h:g} 小时）：尽快完成"),
    "spot-policy.stop.budget": (
        "保存检查点后停止：任务总费用至少将达到 {need:.2f}，超出预算 {budget:.2f}（目前已花费 {spent:.2f}）"
    ),
    "spot-policy.unmeasured": "在 {zone} 使用抢占式实例：尚未测得训练步时，暂无可依据的计划",
    "spot-policy.unmeasured.on-demand": "按量付费：没有可用区有抢占式容量，且尚未测得训练步时",
    "gang.hold": (
        "节点 {node} 的替换实例在 {zone} 没有容量：其余节点等待（计费）最多 {minutes} 分钟，"
        "之后由策略决定继续等待还是整组迁移"
    ),
    "gang.move": (
        "节点 {node} 的替换实例在 {zone} 等待 {minutes} 分钟后仍没有容量：整组迁往别处，从最新的完整检查点继续"
    ),
    "gang.replace-one": (
        "只替换丢失的节点：约 {replace_s} 秒后恢复训练（启动 {launch_s} 秒、恢复 {restore_s} 秒，其余节点保持），"
        "全部 {nodes} 个节点重启则需 {whole_s} 秒"
    ),
    "gang.whole-gang": (
        "重启全部 {nodes} 个节点：约 {whole_s} 秒后恢复训练，只替换丢失的节点需 {replace_s} 秒"
        "（此处启动只需 {launch_s} 秒，少于其余节点重新组队的时间）"
    ),
    "gang.replace-one.default": (
        "只替换丢失的节点：约 {replace_s} 秒后恢复训练，全部 {nodes} 个节点重启需 {whole_s} 秒"
        "（按云上的启动和恢复时间估计：本作业尚未测得自己的）"
    ),
    "gang.whole-gang.default": (
        "重启全部 {nodes} 个节点：约 {whole_s} 秒后恢复训练，只替换丢失的节点需 {replace_s} 秒"
        "（按云上的启动和恢复时间估计：本作业尚未测得自己的）"
    ),
    "spot-policy.spot.first": "抢占式实例（{zone}）：优先使用抢占式实例，各处都没有容量时才改用按量付费",
    "spot-policy.on-demand.first": "现在使用按量付费：没有可用区有抢占式容量",
    "spot-policy.unmeasured.wait": "等待抢占式容量：没有可用区有容量，且尚未测得训练步时",
    # 对账：机器人记录与云平台列出的实例不一致时（handlers/reconcile.py）
    "reconcile.not-listed": "云平台没有列出 {instance}",
    "reconcile.listed-as": "云平台显示 {instance} 的状态为 {state}",
    "reconcile.job-unknown": "它所属的任务 {job} 机器人并不知道",
    "reconcile.job-over": "它所属的任务 {job} 已是 {state}",
    "reconcile.moved-on": "它运行的是 {job} 的第 {attempt} 次尝试，而任务已到第 {current} 次尝试",
    "reconcile.moved-on-untagged": "它运行的是 {job} 较早的一次尝试，而任务已到第 {current} 次尝试",
    "reconcile.silent": "已有 {minutes} 分钟没有报告",
    # 任务为何失败（handlers/failures.py）；云平台、存储或训练程序的原话照原样引用
    "failure.launch-failed": "实例启动失败：{error}",
    "failure.start-timeout": "运行器没有按时报告已启动",
    "failure.replacement-gone": "替换用的实例 {instance} 已消失",
    "failure.no-progress": "已连续 {count} 次尝试没有任何进展，最后一次{last}；不再重新启动",
    "failure.capacity": "容量不足：{error}",
    "failure.interrupted": "被中断（{notice}）",
    "failure.instance-gone": "实例已消失（{detail}）",
    "failure.hung": "训练进程在同一实例上卡住两次，第二次在第 {step} 步",
    "failure.storage-unreachable": "无法访问检查点存储：{error}",
    "failure.trainer-not-found": "无法启动训练程序：找不到 {program!r}",
    "failure.trainer-not-on-path": "无法启动训练程序：在可执行文件搜索路径（{path}）中找不到 {program!r}",
    "failure.trainer-not-executable": "无法启动训练程序：{program!r} 不可执行",
    "failure.trainer-out-of-reach": (
        "无法启动训练程序：训练用户 {user} 访问不到 {program!r}（路径上有目录对 {user} 关闭）；"
        "请把它安装到 {user} 能访问的位置，或把 {setting} 设为能访问它的用户"
    ),
    "failure.trainer-not-started": "无法启动训练程序 {program!r}：{error}",
    "failure.metadata-guard-failed": "未启动训练程序：无法阻止训练用户访问实例元数据服务（{error}）",
    "failure.trainer-exited": "训练程序以退出码 {exit_code} 结束；已重启 {restarts} 次，不再重试：{line}",
    "failure.trainer-exited-silent": "训练程序以退出码 {exit_code} 结束；已重启 {restarts} 次，不再重试",
    "failure.output-not-stored": "无法保存最终输出：{error}",
}

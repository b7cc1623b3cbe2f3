"""简体中文: the same keys and placeholders as ``en.py`` (a test holds them in step)."""

from __future__ import annotations

MESSAGES: dict[str, str] = {
    # 任务卡片
    "card.title": "{job} · {recipe}",
    "label.state": "状态",
    "label.instance": "实例",
    "label.price": "价格",
    "label.step": "步数",
    "label.eta": "预计剩余",
    "label.cost": "费用",
    "label.checkpoint": "检查点",
    "label.interruptions": "中断",
    "label.problem": "问题",
    "label.on-call": "值班",
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
    "card.price": "${price:.2f}/小时",
    "card.loss": " · 损失 {loss:.4f}",
    "card.eta.minutes": "{minutes:.0f} 分钟",
    "card.eta.seconds": "{seconds:.0f} 秒",
    "card.cost": "${paid:.4f}{saving}",
    "card.saving": " · 比按量付费节省 {savings:.0%}",
    "card.checkpoint": "第 {step} 步 · {uri}",
    "card.interruptions": "{count} 次 · 丢失 {lost} 步 · 停机 {downtime:.0f} 秒",
    "card.acked": "已由 {by} 于 {at} 确认",
    "card.paged": "已通知 {sent} 次，尚无人确认",
    "button.ack": "确认",
    "button.stop": "停止",
    "button.retry": "重试",
    "button.on-demand": "改用按量付费",
    # 句中的时间与列表
    "time.format": "%H:%M:%S（UTC）",
    "time.unknown": "未知时间",
    "list.separator": "，",
    "timing.item": "{name} {seconds:.1f} 秒",
    "phase.save": "保存",
    "phase.upload": "上传",
    "phase.total": "合计",
    "action.stop": "停止",
    "action.drill": "演练",
    "action.launch": "启动",
    # 按主题的群消息、告警与值班通知
    "topic.interruption-warning": (
        "⚠️ 任务 {job} 所在的抢占式实例 {instance} 收到中断预警（来源：{source}），"
        "将于 {deadline} 被回收。正在保存检查点。"
    ),
    "topic.interrupted.saved": "💾 第 {step} 步的检查点已在回收前保存（{timing}）。正在重新启动…",
    "topic.interrupted.late": "💾 第 {step} 步的检查点未能及时保存（{note}）（{timing}）。正在重新启动…",
    "topic.resumed": (
        "🔁 第 {attempt} 次尝试已在 {zone} 从第 {step} 步恢复：丢失 {lost} 步，停机 {downtime:.0f} 秒{skipped}。"
    ),
    "topic.resumed.new-zone": "新的可用区",
    "topic.resumed.skipped": "；跳过了 {count} 个无效检查点",
    "topic.completed": (
        "✅ 任务 {job} 已完成：共 {attempts} 次尝试、{interruptions} 次中断，丢失 {lost} 步，"
        "停机 {downtime:.0f} 秒，费用 ${paid:.4f}{saving}。输出：{output}"
    ),
    "topic.completed.saving": "，比按量付费节省 {savings:.0%}",
    "topic.failed": "❌ 任务 {job} 失败：{reason}",
    "topic.resume-failed": (
        "🚨 值班{again}：任务 {job} 无法恢复（{reason}）。"
        "请回复 `/finetune ack {job}` 认领，然后 `resume {job}` 或 `resume {job} on-demand`，或 `stop {job}`。"
    ),
    "topic.resume-failed.again": "（第 {number} 级升级，共 {steps} 级，尚无人确认）",
    "topic.drill-started": "🧪 {by} 在实例 {instance} 上发起了中断演练。",
    "topic.stop-requested": "⏹️ {by} 请求停止：先保存检查点，再释放实例。",
    "topic.stopped": "⏹️ 任务 {job} 已停止。",
    "topic.stopped.kept": "⏹️ 任务 {job} 已停止；保留第 {step} 步的检查点。",
    "topic.acked": "👀 {by} 已于 {at} 确认任务 {job} 的值班通知，升级停止。",
    "topic.resume-requested": "🔁 {by} 请求以{market}方式恢复任务 {job}。",
    "topic.rebalance": "↔️ 再平衡建议：实例被回收的风险升高，提前保存检查点。",
    "topic.rebalance-checkpoint": "💾 第 {step} 步的提前检查点已在 {seconds:.1f} 秒内提交。",
    "topic.instance-gone": "⚠️ 实例 {instance} 未经通知即消失；正在从最近的检查点重新启动。",
    "topic.other-failed": "⚠️ 任务 {job} 的{what}操作失败：{reason}",
    "topic.other-done": "ℹ️ {detail}",
    "topic.unknown": "{job}：{topic}",
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
}

"""How checks are said: one line each, ``✓`` or ``✗`` with what is wrong and the fix; the exit status; and the one
line ``serve`` stops with. Pure: no I/O."""

from __future__ import annotations

from collections.abc import Sequence

from bot.checks.result import Check

PASS = "✓"
FAIL = "✗"


def line(check: Check) -> str:
    """``✓ name: detail``, or ``✗ name: detail — fix: …``; always one line."""
    mark = PASS if check.ok else FAIL
    text = f"{mark} {check.name}: {check.detail}"
    if not check.ok and check.fix:
        text += f" — fix: {check.fix}"
    return " ".join(text.split())  # a newline in an error message from outside stays on this line


def exit_status(checks: Sequence[Check]) -> int:
    """0 when every check passed, 1 otherwise."""
    return 0 if all(check.ok for check in checks) else 1


def start_refusal(checks: Sequence[Check], cloud: str) -> str | None:
    """The one line ``serve`` stops with when a check that blocks the start failed (None: it may start): the
    problem and its fix, or, when several, each problem and where the fixes are."""
    blocking = [check for check in checks if not check.ok and check.blocks_start]
    if not blocking:
        return None
    if len(blocking) == 1:
        (only,) = blocking
        return " ".join(f"cannot serve on {cloud}: {only.name}: {only.detail} — fix: {only.fix}".split())
    problems = "; ".join(f"{check.name}: {check.detail}" for check in blocking)
    return " ".join(f"cannot serve on {cloud}: {problems} — `finetune-bot check` says how to fix each".split())

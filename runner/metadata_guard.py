"""The trainer's user may not reach the instance metadata service: a per-uid firewall rule, installed by the runner.

The metadata service hands the instance role's credentials to any local process that asks (AWS at
``169.254.169.254`` and ``fd00:ec2::254``, Alibaba Cloud at ``100.100.100.200``; a session token is no barrier, any
process may ask for one). The trainer runs code a chat user chose, as a user of its own; with the service in reach it
would act as the runner's role. So a root runner, before it starts the trainer, rejects that user's traffic to those
addresses: ``iptables`` / ``ip6tables`` with the ``owner`` match, in a chain of our own (``FINETUNE-METADATA``) that
``OUTPUT`` jumps to. Installing it again flushes and refills the chain and adds the jump only where it is missing, so a
restarted runner (or another trainer user) never stacks duplicates.

Why iptables: the runner images are the Deep Learning AMIs (Ubuntu) and Alibaba's GPU images, which carry it (Docker
and cloud-init use it), and it drives both kernels' back ends (legacy and nf_tables) with the same ``owner`` match;
``nft`` is not on every image. ``deploy/image/install.sh`` warns where iptables is missing.

``FINETUNE_METADATA_GUARD``: ``required`` (the default, and what the runner's systemd unit says): the rule goes in or
the trainer does not start (the ``failed`` report says why, exit code 4). ``off``: no rule, said in the log as a
warning: for the local cloud, whose metadata service is a local stand-in and whose host's firewall is not ours. A
trainer that runs as the runner's own user needs no rule: it already holds everything the runner holds.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from runner.errors import RunnerError
from runner.trainer_user import TrainerUser

log = logging.getLogger(__name__)

METADATA_GUARD_ENV = "FINETUNE_METADATA_GUARD"
GUARD_SETTINGS = ("required", "off")
CHAIN = "FINETUNE-METADATA"
IPV4_METADATA = ("169.254.169.254", "100.100.100.200")  # AWS IMDS, Alibaba Cloud metadata
IPV6_METADATA = ("fd00:ec2::254",)  # AWS IMDS on Nitro instances with IPv6
_IPV6_KERNEL = Path("/proc/net/if_inet6")  # absent where the kernel has no IPv6: nothing to reject there


class GuardError(RunnerError):
    """The rule could not be installed (the message says which command, and what it said)."""


@dataclass(frozen=True, slots=True)
class Step:
    """One command of the plan, skipped when ``unless`` (a check) succeeds."""

    run: tuple[str, ...]
    unless: tuple[str, ...] | None = None


def guard_steps(tool: str, uid: int, addresses: Sequence[str], chain: str = CHAIN) -> list[Step]:
    """The commands that make ``chain`` reject ``uid``'s traffic to ``addresses``, idempotently (``tool`` is
    ``iptables`` or ``ip6tables``; ``-w`` waits for the lock Docker or another runner may hold)."""
    base = (tool, "-w")
    rules = [
        Step((*base, "-A", chain, "-d", address, "-m", "owner", "--uid-owner", str(uid), "-j", "REJECT"))
        for address in addresses
    ]
    return [
        Step((*base, "-N", chain), unless=(*base, "-n", "-L", chain)),
        Step((*base, "-F", chain)),
        *rules,
        Step((*base, "-I", "OUTPUT", "1", "-j", chain), unless=(*base, "-C", "OUTPUT", "-j", chain)),
    ]


@dataclass(frozen=True, slots=True)
class MetadataGuard:
    """The rule for one trainer user; the addresses and the chain are fields so a test can aim it elsewhere."""

    uid: int
    ipv4: tuple[str, ...] = IPV4_METADATA
    ipv6: tuple[str, ...] = IPV6_METADATA
    chain: str = CHAIN

    def plan(self, with_ipv6: bool) -> list[Step]:
        steps = guard_steps("iptables", self.uid, self.ipv4, self.chain)
        if with_ipv6 and self.ipv6:
            steps += guard_steps("ip6tables", self.uid, self.ipv6, self.chain)
        return steps

    async def install(self) -> None:
        """Put the rule in place; GuardError when a tool is missing or a command fails."""
        with_ipv6 = _IPV6_KERNEL.exists()
        steps = self.plan(with_ipv6)
        for tool in dict.fromkeys(step.run[0] for step in steps):  # iptables first
            if shutil.which(tool) is None:
                raise GuardError(f"{tool} is not installed")
        for step in steps:
            if step.unless is not None and (await _run(step.unless))[0] == 0:
                continue
            code, said = await _run(step.run)
            if code != 0:
                raise GuardError(f"`{' '.join(step.run)}` failed ({code}): {said or 'no message'}")
        family = "IPv4 and IPv6" if with_ipv6 else "IPv4 (this kernel has no IPv6)"
        log.info("metadata guard: uid %d may not reach %s (%s)", self.uid, ", ".join(self.ipv4 + self.ipv6), family)


async def _run(argv: Sequence[str]) -> tuple[int, str]:
    """Exit code and the last line of stderr (a command that cannot be started reads as 127)."""
    try:
        process = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
    except OSError as exc:
        return 127, str(exc.strerror or exc)
    _, err = await process.communicate()
    lines = err.decode(errors="replace").strip().splitlines()
    return process.returncode or 0, lines[-1][:300] if lines else ""


def metadata_guard(setting: str | None, user: TrainerUser | None) -> MetadataGuard | None:
    """The guard the runner installs before its trainer starts, or None (said in the log); ValueError for a setting
    that is neither ``required`` nor ``off``."""
    value = (setting or "required").strip().lower()
    if value not in GUARD_SETTINGS:
        raise ValueError(f"{METADATA_GUARD_ENV}={setting!r}: must be one of {', '.join(GUARD_SETTINGS)}")
    if user is None:
        log.info("no metadata guard: the trainer runs as the runner and holds what the runner holds")
        return None
    if value == "off":
        log.warning(
            "%s=off: the trainer (%s) can reach the instance metadata service, and with it the instance's role",
            METADATA_GUARD_ENV,
            user.name,
        )
        return None
    return MetadataGuard(uid=user.uid)

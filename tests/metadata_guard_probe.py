"""Run inside a network namespace of its own (``unshare --net``): the metadata addresses on its loopback, each with a
listener, the real guard installed, and who can still connect. Prints one JSON object. The namespace goes away with
this process, and every rule with it: nothing is left on the host.

    python -m tests.metadata_guard_probe rules TRAINER_UID OTHER_UID
    python -m tests.metadata_guard_probe runner SPEC WORK_DIR   (the real runner, in the same namespace; env as given)
"""

from __future__ import annotations

import asyncio
import encodings.idna  # noqa: F401  (socket needs it for a str address; after setuid it may not be importable)
import json
import os
import pwd
import socket
import subprocess
import sys
import threading

from runner.metadata_guard import CHAIN, IPV4_METADATA, IPV6_METADATA, MetadataGuard

PORT = 80
ADDRESSES = IPV4_METADATA + IPV6_METADATA


def setup() -> list[socket.socket]:
    """Loopback up, the metadata addresses on it, a listener on each (accepting and closing)."""
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    for address in IPV4_METADATA:
        subprocess.run(["ip", "addr", "add", f"{address}/32", "dev", "lo"], check=True)
    for address in IPV6_METADATA:
        subprocess.run(["ip", "-6", "addr", "add", f"{address}/128", "dev", "lo", "nodad"], check=True)
    listeners = []
    for address in ADDRESSES:
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        listener = socket.socket(family, socket.SOCK_STREAM)
        listener.bind((address, PORT))
        listener.listen(16)
        threading.Thread(target=_accept, args=(listener,), daemon=True).start()
        listeners.append(listener)
    return listeners


def _accept(listener: socket.socket) -> None:
    while True:
        connection, _ = listener.accept()
        connection.close()


def reach_as(uid: int, address: str) -> str:
    """``open``, ``refused`` or ``error:<errno>`` for a connection from a process of ``uid``."""
    pid = os.fork()
    if pid == 0:  # the child: become uid, try once, say it in the exit code
        code = 3
        try:
            if uid != 0:
                os.setgroups([])
                os.setgid(pwd.getpwuid(uid).pw_gid)
                os.setuid(uid)
            with socket.create_connection((address, PORT), timeout=3):
                code = 0
        except ConnectionRefusedError:
            code = 1
        except OSError:
            code = 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return {0: "open", 1: "refused"}.get(os.waitstatus_to_exitcode(status), "error")


def rules(tool: str) -> dict[str, list[str]]:
    chain = subprocess.run([tool, "-w", "-S", CHAIN], capture_output=True, text=True, check=True).stdout
    output = subprocess.run([tool, "-w", "-S", "OUTPUT"], capture_output=True, text=True, check=True).stdout
    return {
        "chain": [line for line in chain.splitlines() if line.startswith("-A")],
        "jumps": [line for line in output.splitlines() if line == f"-A OUTPUT -j {CHAIN}"],
    }


def probe_rules(trainer_uid: int, other_uid: int) -> dict[str, object]:
    setup()
    guard = MetadataGuard(uid=trainer_uid)
    asyncio.run(guard.install())
    asyncio.run(guard.install())  # a restarted runner: the same rules, not twice
    return {
        "iptables": rules("iptables"),
        "ip6tables": rules("ip6tables"),
        "reach": {
            address: {
                "root": reach_as(0, address),
                "trainer": reach_as(trainer_uid, address),
                "other": reach_as(other_uid, address),
            }
            for address in ADDRESSES
        },
    }


def probe_runner(spec: str, work_dir: str) -> dict[str, object]:
    setup()
    ran = subprocess.run(
        [sys.executable, "-m", "runner.cli", "run", "--spec", spec, "--work-dir", work_dir],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return {
        "exit_code": ran.returncode,
        "stderr": ran.stderr[-3000:],
        "root": {address: reach_as(0, address) for address in ADDRESSES},
    }


def main(argv: list[str]) -> int:
    result = probe_rules(int(argv[1]), int(argv[2])) if argv[0] == "rules" else probe_runner(argv[1], argv[2])
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""How the supervisors of one gang agree on its restarts in place (``supervisor``). Torch-free on purpose: a
supervisor holds no more than the standard library, so it adds megabytes to a rank, not torch's hundreds.

Restart ``n`` is announced once, by the first supervisor whose child failed, with the reason, and every supervisor
hears it. Rank 0's supervisor serves the announcements on MASTER_PORT + 1: each supervisor, rank 0's included,
keeps one TCP connection to it, sends ``restart <n> <why>`` lines and reads every announcement back, the earlier
ones first when it connects late. A supervisor that loses that connection hears no more restarts, and a failure of
its child then ends it, for whoever started it to restart the gang another way.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from typing import Protocol

STORE_PORT_OFFSET = 1
"""Rank 0's supervisor serves the gang's restarts on MASTER_PORT + 1 (the process group keeps MASTER_PORT)."""


class Gang(Protocol):
    def announce(self, restart: int, why: str) -> bool:
        """Announce restart ``restart``; False when the gang cannot be reached."""
        ...

    def heard(self) -> int:
        """The newest restart announced so far (0: none)."""
        ...

    def why(self, restart: int) -> str:
        """The reason restart ``restart`` was announced with (empty if not heard)."""
        ...

    def wakeup_fd(self) -> int:
        """Readable once a restart is heard (whoever waits on it empties it)."""
        ...


def _line(restart: int, why: str) -> bytes:
    return f"restart {restart} {' '.join(why.split())}\n".encode()


def _parse(line: bytes) -> tuple[int, str] | None:
    word, _, rest = line.decode(errors="replace").strip().partition(" ")
    number, _, why = rest.partition(" ")
    return (int(number), why) if word == "restart" and number.isdigit() else None


class Server:
    """Rank 0's side: records each restart the first time it is announced and sends it to every member."""

    def __init__(self, port: int) -> None:
        if socket.has_dualstack_ipv6():
            self._socket = socket.create_server(("", port), family=socket.AF_INET6, dualstack_ipv6=True)
        else:
            self._socket = socket.create_server(("", port))
        self._announced: dict[int, bytes] = {}
        self._members: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, name="ddp-trainer-gang-server", daemon=True).start()

    def _accept(self) -> None:
        while True:
            conn, _ = self._socket.accept()
            with self._lock:
                self._members.append(conn)
                history = b"".join(self._announced[n] for n in sorted(self._announced))
            with contextlib.suppress(OSError):
                conn.sendall(history)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with contextlib.suppress(OSError), conn.makefile("rb") as lines:
            for line in lines:
                parsed = _parse(line)
                if parsed is None:
                    continue
                with self._lock:
                    if parsed[0] in self._announced:
                        continue
                    self._announced[parsed[0]] = line
                    members = list(self._members)
                for member in members:
                    with contextlib.suppress(OSError):
                        member.sendall(line)
        with self._lock:
            self._members.remove(conn)


class Member:
    """One supervisor's connection to the gang: connects in the background (rank 0's supervisor may start later),
    and hears announcements on a thread of its own."""

    def __init__(self, host: str, port: int, connect_timeout: float) -> None:
        self._address = (host, port)
        self._timeout = connect_timeout
        self._heard = 0
        self._reasons: dict[int, str] = {}
        self._connected = threading.Event()
        self._lost = threading.Event()
        self._socket: socket.socket | None = None
        self._lock = threading.Lock()
        self._read, self._write = os.pipe()
        threading.Thread(target=self._listen, name="ddp-trainer-gang", daemon=True).start()

    def announce(self, restart: int, why: str) -> bool:
        if not self._connected.wait(self._timeout) or self._lost.is_set() or self._socket is None:
            return False
        try:
            self._socket.sendall(_line(restart, why))
            return True
        except OSError:
            return False

    def heard(self) -> int:
        with self._lock:
            return self._heard

    def why(self, restart: int) -> str:
        with self._lock:
            return self._reasons.get(restart, "")

    def wakeup_fd(self) -> int:
        return self._read

    def _listen(self) -> None:
        deadline = time.monotonic() + self._timeout
        while self._socket is None:
            try:
                self._socket = socket.create_connection(self._address, timeout=5)
            except OSError:
                if time.monotonic() > deadline:
                    self._lost.set()
                    return
                time.sleep(0.2)
        self._socket.settimeout(None)
        self._connected.set()
        with contextlib.suppress(OSError), self._socket.makefile("rb") as lines:
            for line in lines:
                parsed = _parse(line)
                if parsed is not None:
                    with self._lock:
                        self._heard = max(self._heard, parsed[0])
                        self._reasons[parsed[0]] = parsed[1]
                    os.write(self._write, b"r")
        self._lost.set()


class Alone:
    """A process launched alone (no MASTER_ADDR): its restarts concern itself only."""

    def __init__(self) -> None:
        self._heard = 0
        self._reasons: dict[int, str] = {}
        self._read, self._write = os.pipe()

    def announce(self, restart: int, why: str) -> bool:
        self._heard = max(self._heard, restart)
        self._reasons.setdefault(restart, why)
        os.write(self._write, b"r")
        return True

    def heard(self) -> int:
        return self._heard

    def why(self, restart: int) -> str:
        return self._reasons.get(restart, "")

    def wakeup_fd(self) -> int:
        return self._read

"""How the supervisors of one gang agree on its restarts in place (``supervisor``). Torch-free on purpose: a
supervisor holds no more than the standard library, so it adds megabytes to a rank, not torch's hundreds.

Rank 0's supervisor serves the gang on MASTER_PORT + 1. Each supervisor, rank 0's included, keeps one TCP
connection to it and sends lines; every line the server takes is sent to every member, the earlier ones first to a
member that connects late:

- ``restart <n> <why>``: restart ``n`` of the gang's processes, taken once, with the reason it was first announced
  with;
- ``stop <why>``: no more restarts in place (a rank's failure that a restart in place must not hide, such as an OOM
  kill, or a rank out of restarts). The server says it too when a member's connection ends: that supervisor is
  gone, and its rank with it.

A supervisor that loses its connection hears nothing more and restarts nothing: a failure of its child then ends
it, for whoever started it to restart the gang another way.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from typing import Protocol

STORE_PORT_OFFSET = 1
"""Rank 0's supervisor serves the gang on MASTER_PORT + 1 (the process group keeps MASTER_PORT)."""


class Gang(Protocol):
    def announce(self, restart: int, why: str) -> bool:
        """Announce restart ``restart``; False when the gang cannot be reached."""
        ...

    def stop(self, why: str) -> None:
        """Announce that the gang restarts nothing more in place."""
        ...

    def heard(self) -> int:
        """The newest restart announced so far (0: none)."""
        ...

    def why(self, restart: int) -> str:
        """The reason restart ``restart`` was announced with (empty if not heard)."""
        ...

    def stopped(self) -> str:
        """Why the gang restarts nothing more in place; empty while it may."""
        ...

    def wakeup_fd(self) -> int:
        """Readable once something is heard (whoever waits on it empties it)."""
        ...


def _clean(why: str) -> str:
    return " ".join(why.split())


class Server:
    """Rank 0's side: takes each restart the first time it is announced, and the first stop, and sends them to every
    member; says stop when a member's connection ends."""

    def __init__(self, port: int) -> None:
        if socket.has_dualstack_ipv6():
            self._socket = socket.create_server(("", port), family=socket.AF_INET6, dualstack_ipv6=True)
        else:
            self._socket = socket.create_server(("", port))
        self._said: list[bytes] = []
        self._restarts: set[int] = set()
        self._stopped = False
        self._members: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, name="ddp-trainer-gang-server", daemon=True).start()

    def _accept(self) -> None:
        while True:
            conn, _ = self._socket.accept()
            with self._lock:
                self._members.append(conn)
                history = b"".join(self._said)
            with contextlib.suppress(OSError):
                conn.sendall(history)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        name = "a rank"
        with contextlib.suppress(OSError), conn.makefile("rb") as lines:
            for raw in lines:
                word, _, rest = raw.decode(errors="replace").strip().partition(" ")
                if word == "hello":
                    name = f"rank {rest}"
                elif word in ("restart", "stop"):
                    self._take(word, rest)
        with self._lock:
            self._members.remove(conn)
        self._take("stop", f"the supervisor of {name} is gone")

    def _take(self, word: str, rest: str) -> None:
        with self._lock:
            if self._stopped:
                return
            if word == "restart":
                number, _, _ = rest.partition(" ")
                if not number.isdigit() or int(number) in self._restarts:
                    return
                self._restarts.add(int(number))
            else:
                self._stopped = True
            line = f"{word} {rest}\n".encode()
            self._said.append(line)
            members = list(self._members)
        for member in members:
            with contextlib.suppress(OSError):
                member.sendall(line)


class _News:
    """What a supervisor has heard of its gang, and the pipe that wakes it when it hears more (Member and Alone)."""

    def __init__(self) -> None:
        self._heard = 0
        self._reasons: dict[int, str] = {}
        self._stopped = ""
        self._lock = threading.Lock()
        self._read, self._write = os.pipe()

    def heard(self) -> int:
        with self._lock:
            return self._heard

    def why(self, restart: int) -> str:
        with self._lock:
            return self._reasons.get(restart, "")

    def stopped(self) -> str:
        with self._lock:
            return self._stopped

    def wakeup_fd(self) -> int:
        return self._read

    def _hear_restart(self, restart: int, why: str) -> None:
        with self._lock:
            self._heard = max(self._heard, restart)
            self._reasons.setdefault(restart, why)
        os.write(self._write, b"r")

    def _hear_stop(self, why: str) -> None:
        with self._lock:
            self._stopped = self._stopped or why
        os.write(self._write, b"r")


class Member(_News):
    """One supervisor's connection to the gang: connects in the background (rank 0's supervisor may start later),
    and hears what the server says on a thread of its own."""

    def __init__(self, host: str, port: int, rank: int, connect_timeout: float) -> None:
        super().__init__()
        self._address = (host, port)
        self._rank = rank
        self._timeout = connect_timeout
        self._connected = threading.Event()
        self._lost = threading.Event()
        self._socket: socket.socket | None = None
        threading.Thread(target=self._listen, name="ddp-trainer-gang", daemon=True).start()

    def announce(self, restart: int, why: str) -> bool:
        return self._send(f"restart {restart} {_clean(why)}")

    def stop(self, why: str) -> None:
        self._send(f"stop {_clean(why)}")

    def _send(self, line: str) -> bool:
        if not self._connected.wait(self._timeout) or self._lost.is_set() or self._socket is None:
            return False
        try:
            self._socket.sendall(f"{line}\n".encode())
            return True
        except OSError:
            return False

    def _listen(self) -> None:
        deadline = time.monotonic() + self._timeout
        while self._socket is None:
            try:
                self._socket = socket.create_connection(self._address, timeout=5)
            except OSError:
                if time.monotonic() > deadline:
                    self._lose("cannot reach rank 0's supervisor")
                    return
                time.sleep(0.2)
        self._socket.settimeout(None)
        with contextlib.suppress(OSError):
            self._socket.sendall(f"hello {self._rank}\n".encode())
        self._connected.set()
        with contextlib.suppress(OSError), self._socket.makefile("rb") as lines:
            for raw in lines:
                word, _, rest = raw.decode(errors="replace").strip().partition(" ")
                number, _, why = rest.partition(" ")
                if word == "restart" and number.isdigit():
                    self._hear_restart(int(number), why)
                elif word == "stop":
                    self._hear_stop(rest)
        self._lose("lost the connection to rank 0's supervisor")

    def _lose(self, why: str) -> None:
        self._lost.set()
        self._hear_stop(why)


class Alone(_News):
    """A process launched alone (no MASTER_ADDR): its restarts concern itself only."""

    def announce(self, restart: int, why: str) -> bool:
        self._hear_restart(restart, _clean(why))
        return True

    def stop(self, why: str) -> None:
        self._hear_stop(_clean(why))

"""Loopback ports: pick free ones, and refuse taken ones with a clear message."""

from __future__ import annotations

import socket

from ddpjob_box.errors import BoxError


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def require_free(port: int, what: str, host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            raise BoxError(
                f"port {port} on {host} for {what} is already in use: stop what holds it "
                f"(ss -ltnp 'sport = :{port}') or choose another port"
            ) from None
    return port

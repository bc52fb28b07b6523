"""Forward TCP from the node's bridge address to the apiserver on loopback.

The apiserver listens on 127.0.0.1 only, which a pod cannot reach from its own
network namespace. kube-proxy sends the ``kubernetes`` Service to the bridge
address; this forwards it on. Run as ``python -m ddpjob_box.kubenode.apiproxy
LISTEN_HOST LISTEN_PORT TARGET_PORT``.
"""

from __future__ import annotations

import socket
import sys
import threading


def pump(src: socket.socket, dst: socket.socket) -> None:
    """Copy ``src`` to ``dst`` until either end closes, then shut both down."""
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for sock in (src, dst):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def _serve(conn: socket.socket, target_port: int) -> None:
    try:
        upstream = socket.create_connection(("127.0.0.1", target_port), timeout=5)
    except OSError:
        conn.close()
        return
    upstream.settimeout(None)
    threading.Thread(target=pump, args=(upstream, conn), daemon=True).start()
    pump(conn, upstream)


def main(argv: list[str]) -> None:
    host, port, target = argv[0], int(argv[1]), int(argv[2])
    server = socket.create_server((host, port), reuse_port=False)
    print(f"forwarding {host}:{port} to 127.0.0.1:{target}", flush=True)
    while True:
        conn, _ = server.accept()
        threading.Thread(target=_serve, args=(conn, target), daemon=True).start()


if __name__ == "__main__":
    main(sys.argv[1:])

"""Pure: the init container that holds a rank until `<job>-0.<job>` names the live rank 0.

Resolving is not enough. Pod names are reused across attempts, so after a gang restart the name can
still resolve to the previous attempt's rank 0 until the EndpointSlice controller and cluster DNS catch
up (chaos soak run 1:64). A rendezvous client that connects to that gone address gets no answer at all,
and torch's TCPStore spends its whole timeout on that one connect. So:

- rank 0 waits until the name resolves to its own pod IPs only (the downward API's `status.podIPs`);
- every other rank waits until each address the name resolves to answers on `MASTER_PORT`, accepting or
  refusing (rank 0's trainer may not listen yet; a refusal still proves the address is a live pod).

It runs the trainer's own image (already pulled: no extra image, no registry) with the trainer's security
context and CPU/memory, so it fits the same quotas and policies.
"""

from __future__ import annotations

import copy
from typing import Any

from ddpjob_contract.pods import ENV_MASTER_ADDR, ENV_MASTER_PORT, ENV_POD_IPS
from ddpjob_operator import api
from ddpjob_operator.api import Job

ENV_WAIT_SECONDS = "DDPJOB_WAIT_SECONDS"

# Exits 0 when the master is ready; otherwise prints why not and exits 1. No single quotes: it is passed
# to `python3 -c '...'`. The env names come first, from the contract, so the check's body needs no braces
# escaped.
_NAMES = f'ADDR, PORT, POD_IPS = "{ENV_MASTER_ADDR}", "{ENV_MASTER_PORT}", "{ENV_POD_IPS}"\n'
_CHECK = """\
import os, socket, sys
name, port = os.environ[ADDR], int(os.environ[PORT])
own = {ip for ip in os.environ.get(POD_IPS, "").split(",") if ip}
try:
    addrs = sorted({a[4][0] for a in socket.getaddrinfo(name, port, type=socket.SOCK_STREAM)})
except OSError as err:
    sys.exit(f"{name} does not resolve ({err})")
if own:
    if set(addrs) <= own:
        sys.exit(0)
    sys.exit(f"{name} resolves to {addrs}, not to this pod {sorted(own)}: DNS still has an old rank 0")

def answers(addr):
    with socket.socket(socket.AF_INET6 if ":" in addr else socket.AF_INET) as s:
        s.settimeout(1)
        try:
            s.connect((addr, port))
        except ConnectionRefusedError:
            return True
        except OSError:
            return False
    return True

dead = [a for a in addrs if not answers(a)]
if dead:
    sys.exit(f"{name} resolves to {dead}, which does not answer on port {port}: DNS still has an old rank 0")
"""
PYTHON_CHECK = _NAMES + _CHECK

# POSIX sh. python3 (every PyTorch image has it) makes the full check; without it, getent or nslookup
# only wait for the name to resolve (and getent, in rank 0, for it to resolve to this pod only).
SCRIPT = f"""\
deadline=$(( $(date +%s) + ${ENV_WAIT_SECONDS} ))
while :; do
  if command -v python3 >/dev/null 2>&1; then why=$(python3 -c '{PYTHON_CHECK}' 2>&1) && exit 0
  elif command -v getent >/dev/null 2>&1; then
    addrs=$(getent hosts "${ENV_MASTER_ADDR}" | awk '{{print $1}}' | sort -u | tr '\\n' ,)
    if [ -n "$addrs" ] && {{ [ -z "${ENV_POD_IPS}" ] || [ "$addrs" = "${ENV_POD_IPS}," ]; }}; then exit 0; fi
    why="${ENV_MASTER_ADDR} resolves to '$addrs'"
  elif command -v nslookup >/dev/null 2>&1; then nslookup "${ENV_MASTER_ADDR}" >/dev/null 2>&1 && exit 0
    why="${ENV_MASTER_ADDR} does not resolve"
  else echo "ddpjob: no python3, getent or nslookup in the image; not waiting for ${ENV_MASTER_ADDR}"; exit 0
  fi
  if [ "$why" != "$said" ]; then echo "ddpjob: waiting for rank 0: $why"; said=$why; fi
  if [ "$(date +%s)" -ge "$deadline" ]; then
    why="rank 0 not ready at ${ENV_MASTER_ADDR} within ${{{ENV_WAIT_SECONDS}}}s (spec.waitForMasterSeconds): $why"
    echo "ddpjob: $why" >&2
    exit 1
  fi
  sleep 1
done
"""


def container(job: Job, trainer: dict[str, Any], rank: int, *, master: str) -> dict[str, Any]:
    """Rank ``rank``'s init container waiting for ``master``, in the image and within the limits of its
    ``trainer`` container."""
    resources = trainer.get("resources") or {}
    small = {
        section: {k: v for k, v in (resources.get(section) or {}).items() if k in ("cpu", "memory")}
        for section in ("requests", "limits")
    }
    env: list[dict[str, Any]] = [
        {"name": ENV_MASTER_ADDR, "value": master},
        {"name": ENV_MASTER_PORT, "value": str(job.spec.port)},
        {"name": ENV_WAIT_SECONDS, "value": str(job.spec.wait_for_master_seconds)},
    ]
    if rank == 0:
        env.append({"name": ENV_POD_IPS, "valueFrom": {"fieldRef": {"fieldPath": "status.podIPs"}}})
    wait: dict[str, Any] = {
        "name": api.WAIT_CONTAINER,
        "image": trainer["image"],
        "command": ["sh", "-c", SCRIPT],
        "env": env,
        "resources": {k: v for k, v in small.items() if v},
    }
    for key in ("imagePullPolicy", "securityContext"):
        if key in trainer:
            wait[key] = copy.deepcopy(trainer[key])
    return wait

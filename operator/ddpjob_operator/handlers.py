"""Kopf glue: a few lines per handler; the ``Runtime`` does the work.

DDPJobs come through our own job watch (``jobwatch``), pods through our own pod cache (one list-and-watch,
filtered by our label on the server), which reconciles read instead of listing pods each time. Kopf runs the
process: startup, login, cleanup, the liveness probe; it watches no resource of ours (its per-event work cost
more than the reconciles, and most events of a job are the echoes of our own status writes).

No on.delete handler and no timers or daemons, hence no finalizers: deleting a DDPJob never
waits for the operator, and owner references let the garbage collector remove the children.
"""

from __future__ import annotations

import logging
import os
import signal
from typing import Any

import kopf

from ddpjob_operator import metrics, namespaces, node_health
from ddpjob_operator.kube import Kube, Unreachable, in_cluster, user_agent
from ddpjob_operator.leadership import ALONE, Election, Elector, Leadership
from ddpjob_operator.policies import node_loss
from ddpjob_operator.runtime import DDPJobsNotServed, Runtime

STARTUP_RETRY_SECONDS = 2


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    settings.posting.level = logging.WARNING  # our own Events describe transitions
    scope = list(memo.get("namespaces") or [])
    # Kopf scans namespaces and CRDs to expand patterns; a plain list needs no scan, and the
    # namespaced chart grants no cluster-wide list rights (it would log Forbidden on every try).
    settings.scanning.disabled = bool(scope) and not namespaces.any_pattern(scope)
    leader = _leader(memo.get("election"))
    try:
        memo.runtime = Runtime(
            scope,
            workers=int(memo.get("workers") or 16),
            progress_interval=float(memo.get("progress_interval") or 15.0),
            progress_timeout=float(memo.get("progress_timeout") or 2.0),
            progress_concurrency=int(memo.get("progress_concurrency") or 32),
            unhealthy_taints=list(memo.get("unhealthy_taints") or node_loss.UNHEALTHY_TAINTS),
            node_exclusion_seconds=float(memo.get("node_exclusion_seconds") or node_health.EXCLUSION_SECONDS),
            node_watch=bool(memo.get("node_watch", True)),
            leader=leader,
        )
    except (Unreachable, DDPJobsNotServed) as err:  # started while the apiserver restarts: one line, and soon again
        leader.stop()  # never started: its client is closed, and it holds nothing
        # (not in 60 s). DDPJobsNotServed matters most: with scanning off, Kopf looks up the DDPJob API once, right
        # after this handler, and a job it did not find then is never watched (chaos soak 8, runs 1:31 to 1:34).
        again = STARTUP_RETRY_SECONDS
        raise kopf.TemporaryError(f"{err}; trying again in {again}s", delay=again) from None
    memo.runtime.start()
    if memo.get("metrics_port"):
        metrics.serve(int(memo["metrics_port"]))


def _leader(election: Election | None) -> Leadership:
    """This replica's part in the leader election, or ``ALONE`` without one. A leader that loses the Lease stops
    writing at once, and stops the process (SIGTERM: Kopf's clean exit), to start again as a standby."""
    if election is None:
        return ALONE
    return Elector(Kube(connections=2, user_agent=user_agent(election.identity)), election.namespace, election.name,
                   election.identity,
                   timing=election.timing, lost=lambda: os.kill(os.getpid(), signal.SIGTERM))  # fmt: skip


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """The same credentials as our client (``kube.in_cluster``); Kopf's default would read KUBECONFIG
    as it was when the kubernetes package was imported."""
    if in_cluster():
        return kopf.login_with_service_account(**kwargs)
    return kopf.login_with_kubeconfig(**kwargs)


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    await memo.runtime.stop()

"""The operator's own Prometheus metrics (the trainer's are in ddpjob_contract.metrics).

Counters count the transitions this operator process performed; PromQL's rate/increase handle
operator restarts, as for any counter.
"""

from __future__ import annotations

import functools

from prometheus_client import Counter, Gauge, Histogram, start_http_server

JOBS_CREATED = Counter("ddpjob_operator_jobs_created_total", "DDPJobs seen for the first time and set up.")
JOBS_SUCCEEDED = Counter("ddpjob_operator_jobs_succeeded_total", "DDPJobs that finished with every rank exiting 0.")
JOBS_FAILED = Counter("ddpjob_operator_jobs_failed_total", "DDPJobs that finished Failed.", ["reason"])
JOBS_RESTARTED = Counter("ddpjob_operator_jobs_restarted_total", "Gang restarts after a retryable failure.")
RECONCILE_SECONDS = Histogram(
    "ddpjob_operator_reconcile_duration_seconds",
    "Time to reconcile one DDPJob: read it and its pods, decide, write.",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
)
RECONCILE_ERRORS = Counter("ddpjob_operator_reconcile_errors_total", "Reconciles that raised and were retried.")
API_REQUESTS = Counter(
    "ddpjob_operator_api_requests_total",
    "Requests to the apiserver (watches aside), by verb, resource and HTTP status code.",
    ["verb", "resource", "code"],
)

LEADER = Gauge("ddpjob_operator_leader", "1 while this replica holds the leader Lease and may write; 0 as a standby.")


@functools.cache
def api_request(verb: str, resource: str, code: int) -> Counter:
    """``API_REQUESTS``' child for these labels, looked up once: ``labels()`` checks and locks on every call, which
    cost more than the count."""
    return API_REQUESTS.labels(verb=verb, resource=resource, code=str(code))


def serve(port: int, addr: str = "0.0.0.0") -> None:
    """Serve /metrics in a background thread."""
    start_http_server(port, addr=addr)

"""The chaos soak's runs: one run (``one_run``: its job made, its faults injected each once the job runs again, its
promises checked; ``guarded_run`` keeps a failure of the harness as that run's violation), the soak of them side by
side (``soak``, with ``Overlaps`` for the replay command), its summary, and ``main`` (``python -m bench.chaos``,
whose help is the package's docstring)."""

from __future__ import annotations

import argparse
import json
import re
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

from bench import chaos
from bench.chaos.faults import (
    ENDING,
    FAULTS,
    HA_FAULTS,
    KUEUE_FAULTS,
    NODE_FAULTS,
    RESTARTING,
    Broken,
    drawn,
    inject,
)
from bench.chaos.invariants import Watchdog, ended_as_promised, too_late
from bench.chaos.job import JobRef, Run, backoff_limit, chaos_job
from bench.chaos.stack import (
    LIVE_OR_OVER,
    NotInjected,
    Stack,
    chaos_stack,
    restarted_or_over,
    status,
    status_now,
    wait,
)
from bench.common import (
    RESULTS_DIR,
    STOPPING,
    log,
    machine,
    need_trainer,
    stop_on_sigterm,
    table,
    write_results,
)
from ddpjob_box import audit
from ddpjob_box.processes import LAST_ERROR_SAID

NAME = "chaos"


def names(seed: int, index: int, namespace: str) -> JobRef:
    """A run's DDPJob and its checkpoints' PVC, in the namespace it was given."""
    return JobRef(namespace, f"chaos-{seed}-{index}", f"ckpt-{seed}-{index}")


def pod_states(stack: Stack, job: JobRef) -> list[str]:
    """'chaos-1-0 Running on box-node-2: trainer running (restarts 0)', for each of the job's pods; [] when the
    apiserver does not answer."""
    try:
        pods = stack.call(stack.core.list_namespaced_pod, job.namespace).items
    except Exception:
        return []
    said = []
    for pod in pods:
        states = []
        for c in pod.status.container_statuses or []:
            state = next((k for k in ("running", "waiting", "terminated") if getattr(c.state, k, None)), "unknown")
            states.append(f"{c.name} {state} (restarts {c.restart_count})")
        said.append(f"{pod.metadata.name} {pod.status.phase} on {pod.spec.node_name or 'no node'}: {', '.join(states)}")
    return said


def queue_states(stack: Stack, job: JobRef) -> list[str]:
    """Under Kueue: each Workload of the run's namespace (its conditions), any other Workload that holds quota in its
    ClusterQueue (where, since when, whether deleted), and the ClusterQueue's usage, said in a line each; [] without
    Kueue or while the apiserver does not answer. For a job that waited too long to be admitted."""
    if not stack.kueue:
        return []
    group, version = "kueue.x-k8s.io", "v1beta2"
    try:
        workloads = stack.call(stack.custom.list_namespaced_custom_object, group, version, job.namespace, "workloads")
        everywhere = stack.call(stack.custom.list_cluster_custom_object, group, version, "workloads")
        queue = stack.call(
            stack.custom.get_cluster_custom_object, group, version, "clusterqueues", f"cq-{job.namespace}"
        )
    except Exception:
        return []
    said = []
    for w in workloads.get("items") or []:
        conditions = [f"{c.get('type')}={c.get('status')} {c.get('reason')}: {c.get('message', '')[:160]}"
                      for c in (w.get("status") or {}).get("conditions") or []]  # fmt: skip
        said.append(f"Workload {w['metadata']['name']}: {'; '.join(conditions) or 'no condition'}")
    elsewhere = [
        w
        for w in everywhere.get("items") or []
        if w["metadata"].get("namespace") != job.namespace
        and ((w.get("status") or {}).get("admission") or {}).get("clusterQueue") == f"cq-{job.namespace}"
    ]
    if not elsewhere:
        said.append(f"no Workload of another namespace holds quota in cq-{job.namespace}")
    for w in elsewhere:
        meta = w["metadata"]
        said.append(f"Workload {meta.get('namespace')}/{meta['name']} holds quota here: created "
                    f"{meta.get('creationTimestamp')}, deleted {meta.get('deletionTimestamp') or 'no'}, "
                    f"finalizers {meta.get('finalizers') or []}")  # fmt: skip
    status = queue.get("status") or {}
    usage = [
        f"{r.get('name')} {r.get('total')}" for f in status.get("flavorsUsage") or [] for r in f.get("resources") or []
    ]
    said.append(
        f"ClusterQueue cq-{job.namespace}: admitted {status.get('admittedWorkloads')}, reserving "
        f"{status.get('reservingWorkloads')}, pending {status.get('pendingWorkloads')}, using {', '.join(usage)}"
    )
    return said


def one_run(stack: Stack, seed: int, index: int, namespace: str) -> Run:
    rng, faults = drawn(seed, index, kueue=stack.kueue, nodes=stack.node_count, replicas=stack.replicas)
    result = Run(seed, index, faults, backoff_limit=backoff_limit(index))
    job = names(seed, index, namespace)
    started = time.monotonic()
    logged = stack.log_marks()  # what earlier runs left in the operators' logs is theirs
    exits = len(stack.exits)
    deleted = ""
    """The fault that deleted the job or its namespace, once injected."""

    def said(what: str) -> None:
        result.timeline.append(f"{time.monotonic() - started:6.1f}s {what}")

    stack.call(stack.core.create_namespaced_persistent_volume_claim, job.namespace, stack.claim(job))
    placed = {"rack": stack.rack_of(namespace), "avoid": stack.avoid}
    body = chaos_job(job.name, job.claim, result.backoff_limit, kueue=stack.kueue, **placed)
    stack.create_job(job, body)
    watchdog = Watchdog(stack, job)
    try:
        for fault in faults:
            if deleted:
                result.skipped.append(fault)
                said(f"skipped {fault}: {deleted} came before it")
                continue
            # A restarted gang that resumes near the end can finish from Rendezvous, never Running again.
            attempt = wait("the job to run", lambda: (s := status(stack, job)).get("phase") in LIVE_OR_OVER and s, 300)
            pause = rng.uniform(1.0, 6.0)  # drawn either way: a replay draws the same numbers
            if attempt["phase"] == "Running":
                time.sleep(pause)
            if status_now(stack, job).get("phase") != "Running":
                result.skipped.append(fault)
                said(f"skipped {fault}: the job left Running before it")  # it finished
                continue
            try:
                note = inject(stack, job, fault, rng)
            except NotInjected as err:
                result.skipped.append(fault)
                said(f"skipped {fault}: {err}")
                continue
            except Broken as err:
                result.violations.append(str(err))
                note = "broke a promise"
            said(f"{fault}{f' {note}' if note else ''} (attempt {attempt['attempt']})")
            if fault in ENDING:
                deleted = fault
            elif fault in (*RESTARTING, *NODE_FAULTS):
                restarted = restarted_or_over(stack, job, int(attempt["attempt"]), int(attempt.get("restarts", 0)))
                after = wait("the restart", restarted, 120)
                same = int(after.get("attempt", 0)) == int(attempt["attempt"])
                late = too_late(fault, after) if same and after.get("phase") == "Succeeded" else ""
                if late:
                    result.skipped.append(fault)
                    said(f"{fault} came too late: {late}")
        if deleted:
            result.outcome = "job deleted" if deleted == "delete-job" else "namespace deleted"
        else:
            over = ("Succeeded", "Failed")
            final = wait(
                "the job to end", lambda: (s := status(stack, job)).get("phase") in over and s, 300 + 60 * len(faults)
            )
            said(f"{final['phase']}")
            result.outcome, result.restarts = final["phase"], int(final.get("restarts", -1))
            result.step = int((final.get("progress") or {}).get("step") or -1)
            ended = [c for c in final.get("conditions") or [] if c.get("type") == final["phase"]]
            result.reason = str(ended[0].get("reason", "")) if ended else ""
    except TimeoutError as err:
        result.outcome = "timeout"
        result.violations.append(str(err))
    finally:
        result.violations += watchdog.stop()
    if result.violations:  # as the run left the job, before its end deletes it
        result.status, result.pods = status(stack, job), pod_states(stack, job) + queue_states(stack, job)
    events = stack.call(
        stack.core.list_namespaced_event, job.namespace, field_selector=f"involvedObject.name={job.name}"
    )
    result.events = [f"{e.reason}: {e.message}" for e in events.items]
    result.node_hits = stack.node_hits.pop(job.name, 0)
    result.violations += ended_as_promised(stack, job, result, deleted)
    result.violations += stack.exits[exits:]
    operator_log = stack.operator_log_since(logged)
    if "Traceback" in operator_log:
        result.violations.append("the operator logged a traceback")
    if result.violations:
        result.operator_log = log_excerpt(operator_log, job.name)
        result.removals = audit.removals(stack.box.plane.audit_log, job.namespace, job.name)
    result.seconds = round(time.monotonic() - started, 1)
    return result


def log_excerpt(log_text: str, name: str, lines: int = 200, tail: int = 3000) -> str:
    """What a violation keeps of the operator's log: the lines that name this job (its whole story, which
    the other runs' lines would push out of a plain tail), then the tail, for what happened around the end."""
    mine = re.compile(re.escape(name) + r"\b")
    said = [line for line in log_text.splitlines() if mine.search(line)]
    return "\n".join(said[-lines:]) + "\n--- the log's tail ---\n" + log_text[-tail:]


class Overlaps:
    """Which runs went on at some moment of each run (with --parallel), for the replay command."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._alive: dict[int, set[int]] = {}
        self.seen: dict[int, set[int]] = {}

    @contextmanager
    def running(self, run: int) -> Iterator[None]:
        with self._lock:
            for other, seen in self._alive.items():
                seen.add(run)
                self.seen.setdefault(run, set()).add(other)
            self._alive[run] = self.seen.setdefault(run, set())
        try:
            yield
        finally:
            with self._lock:
                del self._alive[run]


def guarded_run(stack: Stack, seed: int, index: int, overlaps: Overlaps) -> Run:
    """One run; a failure of the harness itself is kept as that run's violation, and the soak goes on."""
    with overlaps.running(index), stack.namespace_for_a_run() as namespace:
        try:
            result = one_run(stack, seed, index, namespace)
        except Exception as err:  # kept in the results, with the replay command
            failed = f"the harness failed: {type(err).__name__}: {err}"
            result = Run(seed, index, [], outcome="harness-error", violations=[failed])
            job = names(seed, index, namespace)
            for delete in (stack.delete_job, stack.delete_claim):
                try:
                    delete(job)
                except Exception:  # best effort: the box goes when the soak ends
                    pass
    result.alongside = sorted(overlaps.seen.get(index, set()))
    return result


def soak(stack: Stack, seed: int, runs: Sequence[int], out: Path, parallel: int = 1) -> list[Run]:
    """The runs, ``parallel`` at a time; each is logged and written to ``out`` as it ends."""
    results = []
    out.parent.mkdir(parents=True, exist_ok=True)
    overlaps = Overlaps()
    pool = ThreadPoolExecutor(max_workers=parallel, thread_name_prefix="chaos-run")
    try:
        futures = [pool.submit(guarded_run, stack, seed, index, overlaps) for index in runs]
        for future in as_completed(futures):
            result = future.result()
            verdict = "ok" if not result.violations else f"VIOLATION {result.violations}; replay: {result.replay}"
            log(f"run {seed}:{result.run} {result.faults} -> {result.outcome}, restarts {result.restarts}, "
                f"{result.seconds}s: {verdict}")  # fmt: skip
            with out.open("a") as f:
                f.write(json.dumps(asdict(result)) + "\n")
            results.append(result)
    except BaseException:
        STOPPING.set()  # on Ctrl-C the runs under way stop waiting, and no new one starts
        raise
    finally:
        pool.shutdown(cancel_futures=True)
    return sorted(results, key=lambda r: r.run)


def summary(
    results: Sequence[Run], parallel: int, wall_seconds: float, restarted: Sequence[str] = (), fired: Sequence[str] = ()
) -> str:
    """The faults by kind, then the totals; ``restarted``: the box's components that exited on their own;
    ``fired``: the points the armed operator exited at."""
    drawn = Counter(f for r in results for f in r.faults)
    skipped = Counter(f for r in results for f in r.skipped)
    kinds = (*FAULTS, *(k for k in (*KUEUE_FAULTS, *NODE_FAULTS, *HA_FAULTS) if drawn[k]))
    rows = [[kind, drawn[kind] - skipped[kind], skipped[kind]] for kind in kinds]
    head = table(["fault", "injected", "skipped or too late (the job or the rank had ended)"], rows)
    total = [[len(results), parallel, sum(bool(r.violations) for r in results),
              sum(r.outcome == "Succeeded" for r in results), sum(r.restarts for r in results if r.restarts > 0),
              f"{wall_seconds / 60:.1f} min"]]  # fmt: skip
    heads = ["runs", "at once", "with a violation", "succeeded", "restarts", "time"]
    said = [(line.split(" exited", 1)[0], LAST_ERROR_SAID.search(line)) for line in restarted]
    exits = Counter(name for name, _ in said)
    tail = ", ".join(f"{name} {count}" for name, count in sorted(exits.items())) or "none"
    causes = Counter((name, found.group(1)) for name, found in said if found)
    points = ", ".join(f"{point} {count}" for point, count in sorted(Counter(fired).items())) or "none"
    why = "".join(f'\n- {name}, {count} times: "{error}"' for (name, error), count in sorted(causes.items()))
    return (
        head
        + "\n\n"
        + table(heads, total)
        + f"\n\nBox components that exited and were started again: {tail}."
        + (f"\nTheir last error before they exited:{why}" if why else "")
        + f"\n\nThe armed operator exited at its point {len(fired)} times ({points})."
    )


def main(argv: Sequence[str] | None = None) -> None:
    need_trainer("python -m bench.chaos")
    parser = argparse.ArgumentParser(
        prog="python -m bench.chaos", description=chaos.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--parallel", type=int, default=1, help="runs going on at once, each with its own job")
    parser.add_argument("--replay", help="SEED:RUN[,SEED:RUN...]: those runs alone, side by side")
    parser.add_argument("--kueue", action="store_true", help="Kueue in the box, every job queued, and its faults")
    parser.add_argument("--nodes", type=int, default=1, help="real nodes in the box; more than 1 adds NODE_FAULTS")
    parser.add_argument("--replicas", type=int, default=2, choices=(1, 2),
                        help="operator replicas, as the chart runs them: 2 elect a leader on a Lease and add "
                        "HA_FAULTS; 1 replays soaks recorded before 2026-11-29 (their draws had none)")  # fmt: skip
    parser.add_argument(
        "--topology",
        default=None,
        metavar="LEVEL=COUNT,...",
        help="the box's racks (ddpjob cluster up --topology); with --kueue, every other namespace's jobs are placed "
        "by Kueue's topology-aware scheduling, all ranks in one domain of the last level (default with --kueue and "
        "4 or more nodes, an even number: rack=2)",
    )
    args = parser.parse_args(argv)
    stop_on_sigterm()
    seed, runs, parallel = args.seed, list(range(args.runs)), args.parallel
    if args.replay:
        pairs = [tuple(int(x) for x in item.split(":")) for item in args.replay.split(",")]
        if len({s for s, _ in pairs}) != 1:
            parser.error(f"--replay {args.replay}: the runs must share one seed")
        seed, runs, parallel = pairs[0][0], [run for _, run in pairs], len(pairs)
    started = time.monotonic()
    topology = args.topology
    if topology is None:
        topology = "rack=2" if args.kueue and args.nodes >= 4 and args.nodes % 2 == 0 else ""
    with chaos_stack(parallel, kueue=args.kueue, nodes=args.nodes, topology=topology, replicas=args.replicas) as stack:
        results = soak(stack, seed, runs, RESULTS_DIR / f"{NAME}.jsonl", parallel)
        assert stack.box.plane is not None
        restarted, fired, fenced = list(stack.box.plane.restarted), list(stack.fired), list(stack.fenced)
    markdown = summary(results, parallel, time.monotonic() - started, restarted, fired)
    if args.replicas > 1:
        why = Counter(entry.rsplit("(", 1)[-1].rstrip(")") for entry in fenced)
        markdown += (f"\n\nLeaders that could not renew their Lease and stopped and exited, as they must: {len(fenced)}"
                     f" ({', '.join(f'{n} {k}' for k, n in sorted(why.items())) or 'none'}).")  # fmt: skip
    print(markdown)
    data = {"machine": machine(), "seed": seed, "parallel": parallel, "box_restarted": restarted, "fired": fired,
            "replicas": args.replicas, "fenced": fenced}  # fmt: skip
    write_results(NAME, {**data, "runs": [asdict(r) for r in results]}, markdown)
    if any(r.violations for r in results):
        raise SystemExit(1)

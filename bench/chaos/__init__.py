"""Chaos soak: seeded faults against the whole box, with the operator's promises checked after each run.

    python -m bench.chaos --runs 10 --seed 1        # make test runs a short set (tests/e2e/test_chaos.py)
    python -m bench.chaos --runs 200 --seed 1 --parallel 4   # make soak: 4 jobs at a time
    python -m bench.chaos --replay 1:37             # run 37 of seed 1 again, alone
    python -m bench.chaos --replay 1:37,1:38        # those two again, side by side
    python -m bench.chaos --runs 40 --kueue         # Kueue in the box, every job queued, two more faults
    python -m bench.chaos --runs 40 --nodes 3 --parallel 4   # 3 real nodes, and node faults
    python -m bench.chaos --runs 40 --kueue --nodes 4 --parallel 4   # 2 racks of 2 nodes: half the jobs by topology

The box with its node, the trainer image, and the operator as its own process, watching one namespace
per run going on at once (the chart's namespaced mode). Each run creates a 2-rank tinycnn DDPJob that
checkpoints every 10 steps in a namespace no other run uses meanwhile, then injects 1 to 3 faults
chosen and timed by ``random.Random(f"{seed}:{run}")``, each once the job runs again, and waits for the
job to end: a killed rank (its training process, which its supervisor restarts in place, or its container's first
process), a hung one (its training process SIGSTOPped) or a deleted one; the operator SIGKILLed, or armed at a fault
point (``ddpjob_contract.faults``: it exits at its next pod creation or deletion, in whichever job's work);
kubelet, kube-apiserver or etcd restarted; suspend then resume; a spec edit (what may change while it
runs, and a template change, which CEL must refuse); the job, or its whole namespace, deleted while it
runs (always the run's last fault). With ``--parallel N``, N runs go on at once: a restart of kubelet,
the apiserver, etcd or the operator then lands on every job alive at the time, and each of them must
still keep every promise (such a restart causes no counted restart). A box fault passes alone: the
other runs' calls to the apiserver wait until it answers again. Then it checks:

- never two live pods for one rank, nor live pods of two attempts (polled every 0.3 s), but while a gang restarts
  in place, for at most 60 s, as its ranks' pods move into the next attempt one by one;
- ``status.restarts`` equals the restart-causing faults injected (a killed, deleted or hung rank;
  suspend, a spec edit, the operator's, kubelet's, the apiserver's or etcd's restart cause none);
- the job Succeeded and its final step is the configured steps, or, when the faults that cost a restart
  were more than its backoffLimit (0 in every 8th run), it Failed with BackoffLimitExceeded after that
  many restarts; every checkpoint left loads (after a deletion too, unless the namespace took them);
- the operator's log holds no traceback, and the operator never exited unless a fault made it;
- once the job is deleted, no pod, Service or PodGroup of it is left after 60 s of a whole control plane
  (counted from 60 s after the end of the last box fault when that came later: informers back off that
  long; 300 s at most); a deleted namespace is gone within 120 s of it.

With ``--kueue``, the box runs Kueue, every run's namespace has a ClusterQueue of 2 slots of its own (and a
LocalQueue), every job is queued at low priority with a slot per rank, and two faults join the draw: ``preempt`` (a
high-priority job that needs the 2 slots: Kueue must evict the run's job, which the other's success readmits, and
which must still end Succeeded at the last step with no restart counted) and ``restart-kueue`` (Kueue's manager
killed, then ready again; its webhooks refuse pods meanwhile). A deleted job's Workload must go too.

With ``--nodes N``, the box has N real nodes (the controller-manager's node-monitor grace period at 10 s), the
checkpoints go to a ReadWriteMany claim, and two faults join the draw: ``power-cut`` and ``network-cut`` of the node
that runs one of the run's ranks. The node comes back once the job runs again in a later attempt (at most 120 s
later), after a drawn 0-20 s more; one node is down at a time. The cut costs the run's job exactly one restart. A
cut also hits every other run's job with a live rank on that node: each such hit may cost that job one restart
more (one, or none when the cut merged into a restart already under way), and it is checked as a range.

With ``--kueue`` and a topology (``--topology rack=2``, the default with ``--kueue --nodes 4``), the box's nodes
are in racks and every other namespace's ClusterQueue grants the box's topology flavor: its jobs require one rack
(Kueue's topology-aware scheduling; their pods gated until Kueue places them), and a cut node under one of them is
replaced by Kueue in its assignment or the job evicted, as Kueue decides. Under ``--kueue``, the node that runs
Kueue's manager (box-node) is never cut.

Each run is one JSON line in ``bench/results/chaos.jsonl``; a violating run keeps its faults'
timeline, the job's Events, the operator's log tail, the box's audit lines for the job's pods, Service
and PodGroups (who removed what, and when), the runs that went on beside it, and names the command that
replays it with them.
"""

# The soak's modules, each importing only those above it here:
#   job.py         what a run is made of: its job's body and where it lives, its namespace's Kueue queues, its record
#   stack.py       the box as the runs see it (Stack, chaos_stack), the job's status, and the waits on it
#   faults.py      the faults: their kinds, each run's draw of them, and their injection
#   invariants.py  the promises: the watchdog during a run, and the checks after it
#   runner.py      one run, the soak of them side by side, its summary, and main (__main__.py runs it)

"""Prometheus metric names every rank exports, and their labels: the trainer writes them; the operator,
the dashboards and the chart's rules read them.

No metric carries a rank label: Prometheus adds the pod's labels when it scrapes.
"""

from __future__ import annotations

STEP_SECONDS = "ddp_step_seconds"
"""Histogram: wall time of a whole iteration (one optimizer step, data wait included)."""
PHASE_SECONDS = "ddp_phase_seconds"
"""Histogram with label ``phase``: time of each phase of an iteration."""
PHASE_LABEL = "phase"
PHASES = ("data", "forward", "backward", "optimizer")
"""Values of the ``phase`` label, in the order they happen."""
STEPS_TOTAL = "ddp_steps_total"
"""Counter: optimizer steps done by this process."""
SAMPLES_TOTAL = "ddp_samples_total"
"""Counter: samples this process has trained on."""
STEP = "ddp_step"
"""Gauge: the training step reached (the global optimizer step, restored from the checkpoint on
resume; ``ddp_steps_total`` counts only this process's steps and restarts at 0)."""
TARGET_STEP = "ddp_target_step"
"""Gauge: the step the run ends at (``--steps``, or ``--epochs`` x the steps of an epoch), 0 until known. With
``ddp_step`` it gives the percent done and the ETA; a program that cannot know it (epochs over data of unknown
size) leaves it out or at 0."""
LAST_STEP_TIMESTAMP_SECONDS = "ddp_last_step_timestamp_seconds"
"""Gauge: Unix time the last step finished (for stall alerts: ``time() - ddp_last_step...``)."""
LOSS = "ddp_loss"
"""Gauge: loss of the last step on this rank (not averaged across ranks)."""
LAST_CHECKPOINT_STEP = "ddp_last_checkpoint_step"
"""Gauge: step of the newest complete checkpoint this run saved or resumed from (0 before there is one)."""
LAST_CHECKPOINT_TIMESTAMP_SECONDS = "ddp_last_checkpoint_timestamp_seconds"
"""Gauge: Unix time that checkpoint was saved (0: unknown, or none yet)."""
CHECKPOINT_SAVE_SECONDS = "ddp_checkpoint_save_seconds"
"""Gauge: wall time of this run's last save, every rank's part in it included (the operator sizes the pods'
termination grace period from it, so a stop can save one more)."""
RESTART_COUNT = "ddp_restart_count"
"""Gauge: how many times the gang's processes were restarted in place (by the trainer's ``--max-restarts``
supervisor, or torchrun's agent) before this process started: its TORCHELASTIC_RESTART_COUNT."""
RESTART_INFO = "ddp_restart"
"""Info (value 1), from a process restarted in place: label ``reason``, why the gang restarted (for example
"rank 1's training process was killed by SIGKILL")."""
RESTART_REASON_LABEL = "reason"
PROCESS_GROUP_READY = "ddp_process_group_ready"
"""Gauge: 1 once ``init_process_group`` has returned, 0 before (and always 0 when running alone)."""
INFO = "ddp_info"
"""Info (value 1): static labels ``world_size``, ``backend``, ``model``, ``strategy``, ``device``,
``batch_size``, ``amp``, ``data``, ``torch_version``."""
INFO_LABELS = (
    "world_size",
    "backend",
    "model",
    "strategy",
    "device",
    "batch_size",
    "amp",
    "data",
    "torch_version",
)

POLLER_USER_AGENT = "ddpjob-operator"
"""The User-Agent of the operator's polls of a rank's /metrics. A rank's linger after its last step waits for its other
readers (Prometheus) to read the final values, not for these: the operator reads the run's end from the rank's exit
message (``ddpjob_contract.exits``)."""

ALL = (
    STEP_SECONDS,
    PHASE_SECONDS,
    STEPS_TOTAL,
    SAMPLES_TOTAL,
    STEP,
    TARGET_STEP,
    LAST_STEP_TIMESTAMP_SECONDS,
    LOSS,
    LAST_CHECKPOINT_STEP,
    LAST_CHECKPOINT_TIMESTAMP_SECONDS,
    CHECKPOINT_SAVE_SECONDS,
    RESTART_COUNT,
    RESTART_INFO,
    PROCESS_GROUP_READY,
    INFO,
)

"""``python -m ddp_trainer`` as users and the operator start it: exit codes, metrics, launchers, signals."""

from __future__ import annotations

import json
import re
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families

from ddpjob_contract import metrics as names
from ddpjob_contract.exits import EXIT_OK, EXIT_PERMANENT, EXIT_RETRYABLE, EXIT_SIGTERM

from .procs import (
    TINY,
    TORCHRUN,
    clean_env,
    explain,
    free_ports,
    processes,
    rank_env,
    read_until,
    run_ranks,
    trainer,
)


@pytest.mark.parametrize(
    ("args", "env", "named"),
    [
        (["--data", "imagefolder", "--data-dir", "/no/such/dir"], {}, "--data-dir"),
        (["--data", "cifar10", "--data-dir", "/no/such/dir"], {}, "/no/such/dir"),
        (["--batch-size", "0"], {}, "--batch-size"),
        ([], {"TRAIN_BATCH_SIZE": "0"}, "TRAIN_BATCH_SIZE"),
        ([], {"WORLD_SIZE": "2"}, "MASTER_ADDR"),
        (["--model", "resnet51"], {}, "--model"),
    ],
    ids=[
        "missing-data-dir",
        "missing-cifar-dir",
        "batch-size-0",
        "batch-size-0-env",
        "no-master-addr",
        "unknown-model",
    ],
)
def test_bad_input_prints_one_line_naming_the_option_and_exits_with_the_permanent_code(
    args: list[str], env: dict[str, str], named: str
) -> None:
    with processes() as procs:
        done = procs.wait(procs.start(trainer(*args), clean_env(**env)))
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == EXIT_PERMANENT, done.stderr
    assert len(lines) == 1, done.stderr
    assert named in lines[0]
    assert lines[0].startswith("ddp_trainer: error:")


def test_resnet18_trains_20_steps_in_one_process_with_no_environment_set() -> None:
    args = ("--model", "resnet18", "--steps", "20", "--image-size", "32", "--batch-size", "4", "--num-workers", "1")
    with processes() as procs:
        done = procs.wait(procs.start(trainer(*args), clean_env()))
    assert done.returncode == EXIT_OK, done.stderr
    assert "step=20/20" in done.stdout
    assert "world size 1, backend none" in done.stdout
    assert re.search(r"^\S+ \| resnet18 \| 1 \| 4 \|", done.stdout, re.MULTILINE), done.stdout


def test_with_step_timing_off_it_logs_bare_step_counts_and_says_the_run_was_not_timed() -> None:
    env = clean_env(TRAIN_STEP_TIMING="false")
    with processes() as procs:
        done = procs.wait(procs.start(trainer(*TINY, "--steps", "4", "--log-interval", "2"), env))
    assert done.returncode == EXIT_OK, done.stderr
    assert re.findall(r"step=\S+", done.stdout) == ["step=2/4", "step=4/4"], done.stdout
    assert "summary: 4 steps, not timed (--no-step-timing)" in done.stdout


def test_the_same_program_runs_under_torchrun_with_two_processes() -> None:
    args = ["--nproc-per-node", "2", "--master-port", str(free_ports(1)), "-m", "ddp_trainer", *TINY, "--steps", "4"]
    with processes() as procs:
        done = procs.wait(procs.start([str(TORCHRUN), *args], clean_env()))
    assert done.returncode == EXIT_OK, done.stdout + done.stderr
    assert "world size 2, backend gloo" in done.stdout
    assert "step=4/4" in done.stdout
    assert re.search(r"rank 1: step=4/4 loss=\S+ img/s=", done.stdout), "every rank logs its steps"


def test_a_finished_run_leaves_its_final_numbers_as_one_json_line_at_the_termination_message_path(
    tmp_path: Path,
) -> None:
    message = tmp_path / "termination-log"
    message.touch()  # the kubelet makes it; where there is none, nothing is written (the next test)
    with processes() as procs:
        args = trainer(*TINY, "--steps", "5", "--checkpoint-dir", str(tmp_path / "ckpt"), "--checkpoint-interval", "2")
        done = procs.wait(procs.start(args, clean_env(TERMINATION_MESSAGE_PATH=str(message))))
    assert done.returncode == EXIT_OK, done.stdout + done.stderr
    lines = message.read_text().splitlines()
    assert len(lines) == 1, lines
    summary = json.loads(lines[0])
    assert summary["step"] == 5
    # The last save (step 5, the end), which the ranks exit right after: no poll of their metrics sees it.
    assert summary["checkpoint_step"] == 5 and summary["checkpoint_save_seconds"] > 0, summary
    assert abs(summary["checkpoint_time"] - time.time()) < 120, summary
    assert summary["samples"] == 5 * 4  # every step of this process, batch 4
    assert 0 < summary["step_seconds_mean"] < 60
    assert summary["samples_per_second"] == pytest.approx(4 / summary["step_seconds_mean"], rel=0.25)


def test_no_exit_message_file_is_created_where_none_exists(tmp_path: Path) -> None:
    missing = tmp_path / "termination-log"  # outside a container nothing makes it, as /dev/termination-log
    with processes() as procs:
        done = procs.wait(procs.start(trainer(*TINY, "--steps", "2"), clean_env(TERMINATION_MESSAGE_PATH=str(missing))))
    assert done.returncode == EXIT_OK, done.stdout + done.stderr
    assert not missing.exists()


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--model", "resnet5O"], "--model (TRAIN_MODEL): unknown value 'resnet5O'; choose one of"),
        (["--data", "imagefolder", "--data-dir", "/no/such/dir"], "/no/such/dir"),
    ],
    ids=["bad-option", "missing-data"],
)
def test_a_permanent_error_leaves_the_line_it_prints_as_the_termination_message(
    tmp_path: Path, args: list[str], expected: str
) -> None:
    message = tmp_path / "termination-log"
    message.touch()
    with processes() as procs:
        done = procs.wait(procs.start(trainer(*TINY, *args), clean_env(TERMINATION_MESSAGE_PATH=str(message))))
    assert done.returncode == EXIT_PERMANENT
    text = message.read_text().strip()
    assert expected in text
    assert done.stderr.strip() == f"ddp_trainer: error: {text}"


def scrape(port: int) -> dict[str, float]:
    """Every sample on /metrics as ``name{label=value,...}`` -> value."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            samples[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return samples


def test_every_rank_serves_all_metrics_with_counts_equal_to_the_steps_done() -> None:
    steps, batch = 5, 4
    port = free_ports(2)  # each rank serves on METRICS_PORT + LOCAL_RANK
    master = free_ports(1)
    args = trainer(*TINY, "--steps", str(steps), "--metrics-linger-seconds", "120")
    with processes() as procs:
        for rank in range(2):
            procs.start(args, rank_env(rank, 2, master, METRICS_PORT=str(port)))
        scraped = []
        for rank in range(2):
            deadline = time.monotonic() + 120
            while True:
                assert procs.procs[rank].poll() is None, "the rank exited before it could be scraped"
                try:
                    samples = scrape(port + rank)
                    if samples.get(names.STEPS_TOTAL) == steps:
                        break
                except OSError:
                    pass  # not serving yet
                assert time.monotonic() < deadline, "the rank never reported all its steps"
                time.sleep(0.5)
            scraped.append(samples)

    for rank, samples in enumerate(scraped):
        assert samples[f"{names.STEP_SECONDS}_count"] == steps, rank
        for phase in names.PHASES:
            assert samples[f"{names.PHASE_SECONDS}_count{{phase={phase}}}"] == steps, (rank, phase)
        assert samples[names.STEPS_TOTAL] == steps
        assert samples[names.TARGET_STEP] == steps, "the step the run ends at: 100 % in kubectl get ddpj"
        assert samples[names.SAMPLES_TOTAL] == steps * batch
        assert samples[names.PROCESS_GROUP_READY] == 1
        assert samples[names.LAST_STEP_TIMESTAMP_SECONDS] > 1e9  # a Unix time
        assert samples[names.LOSS] > 0
        info = next(k for k in samples if k.startswith(names.INFO + "{"))
        for label in ("world_size=2", "backend=gloo", "model=tinycnn", "batch_size=4"):
            assert label in info, info
        assert "rank" not in info


def test_a_lost_peer_makes_the_survivor_exit_with_the_retryable_code(tmp_path: Path) -> None:
    args = trainer(*TINY, "--steps", "6", "--crash-at-step", "2", "--crash-rank", "1", "--pg-timeout-seconds", "60")
    with processes() as procs:
        done = run_ranks(procs, args)
    assert done[1].returncode == -9, explain(done)
    assert done[0].returncode == EXIT_RETRYABLE, explain(done)
    assert "ddp_trainer: retryable:" in done[0].stderr
    assert "Traceback" not in done[0].stderr


def test_a_peer_killed_after_its_last_step_makes_the_survivor_retry_at_the_final_barrier_not_abort(
    tmp_path: Path,
) -> None:
    # Rank 1 dies right after its last step, so rank 0 is alone at the collective shutdown: it must not
    # report the run done (the peer never finished), and it must not die in gloo's teardown.
    args = trainer(
        *TINY, "--steps", "4", "--crash-at-step", "4", "--crash-rank", "1", "--pg-timeout-seconds", "60",
        "--termination-message-path", str(tmp_path / "message"),
    )  # fmt: skip
    (tmp_path / "message").touch()
    with processes() as procs:
        done = run_ranks(procs, args)
    assert done[1].returncode == -9, explain(done)
    assert done[0].returncode == EXIT_RETRYABLE, explain(done)
    assert "step=4/4" in done[0].stdout, explain(done)
    assert "ddp_trainer: retryable:" in done[0].stderr
    assert "Traceback" not in done[0].stderr and "terminate called" not in done[0].stderr
    assert (tmp_path / "message").read_text().startswith("lost a peer or a collective timed out: ")


def test_sigterm_during_a_blocked_collective_exits_with_143_and_leaves_only_complete_checkpoints(
    tmp_path: Path,
) -> None:
    # Rank 1 sleeps for minutes each step, so rank 0 sits in the gradient all-reduce when SIGTERM
    # comes: a plain Python signal handler would not run until the 300 s collective timeout, and the
    # save at the next step boundary is never reached. The stop ends at its deadline instead, out of a
    # 4 s grace period, as if the kubelet's SIGKILL were near.
    ckpt = tmp_path / "ckpt"
    args = trainer(
        *TINY, "--steps", "50", "--checkpoint-dir", str(ckpt), "--checkpoint-interval", "1",
        "--slow-rank", "1", "--slow-seconds", "300", "--stop-grace-seconds", "4",
    )  # fmt: skip
    master = free_ports(1)
    with processes() as procs:
        rank0 = procs.start(args, rank_env(0, 2, master))
        procs.start(args, rank_env(1, 2, master))
        assert rank0.stdout is not None
        assert "training tinycnn" in rank0.stdout.readline()  # joined the group; next it waits on rank 1
        time.sleep(1)
        rank0.terminate()
        done = procs.wait(rank0, timeout=60)
    assert done.returncode == EXIT_SIGTERM, done.stdout + done.stderr
    assert "saving a checkpoint at the next step boundary" in done.stderr, "the stop was tried first"
    assert "stopping on SIGTERM" in done.stderr, "then ended at its deadline"
    assert "after saving its checkpoint" not in done.stderr
    for path in ckpt.glob("*") if ckpt.exists() else []:
        assert re.fullmatch(r"step-\d{9}\.pt", path.name), f"partial file left: {path.name}"
        torch.load(path, weights_only=True)


def test_sigterm_to_one_rank_mid_run_stops_every_rank_at_one_step_with_its_checkpoint(tmp_path: Path) -> None:
    # No periodic checkpoint at all (the interval is 0: only the end would save one): what is on disk after
    # the stop is the stop's own checkpoint, of the step every rank stopped at. Only rank 0 gets SIGTERM, as
    # when one pod is deleted: the vote at the step boundary stops rank 1 with it.
    ckpt = tmp_path / "ckpt"
    args = trainer(*TINY, "--steps", "100000", "--checkpoint-dir", str(ckpt), "--stop-grace-seconds", "60")
    messages = [tmp_path / "message-0", tmp_path / "message-1"]
    for m in messages:
        m.touch()
    master = free_ports(1)
    with processes() as procs:
        rank0 = procs.start(args, rank_env(0, 2, master, TERMINATION_MESSAGE_PATH=str(messages[0])))
        procs.start(args, rank_env(1, 2, master, TERMINATION_MESSAGE_PATH=str(messages[1])))
        read_until(rank0, "step=5/")
        rank0.terminate()
        done = procs.wait_all(timeout=60)
    assert [d.returncode for d in done] == [EXIT_SIGTERM, EXIT_SIGTERM], explain(done)
    stopped = [re.search(r"stopped (.*) at step (\d+), after saving its checkpoint", d.stderr) for d in done]
    assert all(stopped), explain(done)
    steps = {int(m.group(2)) for m in stopped if m}
    assert len(steps) == 1, f"the ranks stopped at different steps: {steps}"
    step = steps.pop()
    assert step >= 5
    assert [p.name for p in ckpt.iterdir()] == [f"step-{step:09d}.pt"], "one checkpoint, of the stop's step"
    state = torch.load(ckpt / f"step-{step:09d}.pt", weights_only=True)
    assert state["step"] == step and state["saved_at"] > 0
    assert messages[0].read_text().startswith(f"stopped on SIGTERM at step {step}")
    assert messages[1].read_text().startswith(f"stopped with a peer that was asked to stop at step {step}")
    assert "Traceback" not in done[0].stderr + done[1].stderr


def test_a_resumed_run_carries_on_from_the_stop_step(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    common = (*TINY, "--checkpoint-dir", str(ckpt), "--stop-grace-seconds", "60")
    master = free_ports(1)
    with processes() as procs:
        rank0 = procs.start(trainer(*common, "--steps", "100000"), rank_env(0, 2, master))
        procs.start(trainer(*common, "--steps", "100000"), rank_env(1, 2, master))
        read_until(rank0, "step=3/")
        for p in procs.procs:
            p.terminate()  # both, as a suspend deletes every pod
        stopped = procs.wait_all(timeout=60)
        procs.procs.clear()
        assert [d.returncode for d in stopped] == [EXIT_SIGTERM, EXIT_SIGTERM], explain(stopped)
        step = int(re.findall(r"at step (\d+)", stopped[0].stderr)[0])
        done = run_ranks(procs, trainer(*common, "--steps", str(step + 2)))
    assert [d.returncode for d in done] == [EXIT_OK, EXIT_OK], explain(done)
    assert f"resumed from step {step} " in done[0].stdout
    assert f"step={step + 1}/{step + 2}" in done[0].stdout, "no step redone, none skipped"


def test_sigterm_while_a_checkpoint_is_being_written_removes_the_partial_file(tmp_path: Path) -> None:
    partial = tmp_path / ".step-000000001.pt.tmp-1"
    script = (
        "import sys, time\n"
        "from ddp_trainer import signals\n"
        "signals.install()\n"
        "with signals.partial_file(sys.argv[1]):\n"
        "    with open(sys.argv[1], 'wb') as f:\n"
        "        f.write(b'half a checkpoint'); f.flush()\n"
        "        print('writing', flush=True)\n"
        "        time.sleep(120)\n"
    )
    with processes() as procs:
        p = procs.start([sys.executable, "-c", script, str(partial)], clean_env())
        assert p.stdout is not None
        assert p.stdout.readline().strip() == "writing"
        assert partial.exists()
        p.terminate()
        done = procs.wait(p, timeout=30)
    assert done.returncode == EXIT_SIGTERM
    assert not partial.exists()

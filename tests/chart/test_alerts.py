"""The PrometheusRule's alerts, run by promtool against synthetic series: each fires on the failure it
names and stays quiet on a healthy job."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.chart.helm import WITH_MONITORING_CRDS, one, promtool, run, template

JOB = 'namespace="team", ddpjob="j"'
LABELS = {"namespace": "team", "ddpjob": "j"}


def _rules(tmp_path: Path) -> Path:
    docs = template("--set", "prometheusRule.enabled=true", *WITH_MONITORING_CRDS)
    groups = one(docs, "PrometheusRule")["spec"]["groups"]
    for group in groups:  # the expressions are under test; annotations would have to be repeated verbatim
        for rule in group["rules"]:
            rule.pop("annotations", None)
    path = tmp_path / "rules.json"
    path.write_text(json.dumps({"groups": groups}))
    return path


def _promtool_test(tmp_path: Path, series: list[dict[str, str]], alerts: list[dict[str, Any]]) -> None:
    rules = _rules(tmp_path)
    test = {
        "rule_files": [str(rules)],
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": series, "alert_rule_test": alerts}],
    }
    path = tmp_path / "test.json"
    path.write_text(json.dumps(test))
    proc = run([promtool(), "test", "rules", str(path)], check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _firing(alert: str, at: str, *, severity: str = "warning", **labels: str) -> dict[str, Any]:
    return {"eval_time": at, "alertname": alert, "exp_alerts": [{"exp_labels": {**labels, "severity": severity}}]}


def _quiet(alert: str, at: str) -> dict[str, Any]:
    return {"eval_time": at, "alertname": alert, "exp_alerts": []}


def _healthy_steps(minutes: int, *, seconds_per_step: str = "6") -> list[dict[str, str]]:
    """Two ranks doing 60 steps a minute at 0.1 s a step, with equal work per phase."""
    series = []
    for rank in ("0", "1"):
        sel = f'{JOB}, rank="{rank}"'
        series.append({"series": f"ddp_step_seconds_count{{{sel}}}", "values": f"0+60x{minutes}"})
        series.append({"series": f"ddp_step_seconds_sum{{{sel}}}", "values": f"0+{seconds_per_step}x{minutes}"})
        series.append({"series": f'ddp_phase_seconds_sum{{{sel}, phase="forward"}}', "values": f"0+3x{minutes}"})
    return series


def test_the_rules_file_passes_promtool_check(tmp_path: Path) -> None:
    proc = run([promtool(), "check", "rules", str(_rules(tmp_path))], check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "5 rules found" in proc.stdout


def test_a_straggler_rank_fires_after_ten_minutes_and_a_balanced_job_does_not(tmp_path: Path) -> None:
    straggler = [
        {"series": f'ddp_step_seconds_count{{{JOB}, rank="{r}"}}', "values": "0+60x30"} for r in ("0", "1")
    ] + [
        {"series": f'ddp_phase_seconds_sum{{{JOB}, rank="0", phase="forward"}}', "values": "0+30x30"},
        {"series": f'ddp_phase_seconds_sum{{{JOB}, rank="1", phase="forward"}}', "values": "0+6x30"},
        # Backward is where the fast rank waits for the slow one; it must not hide the straggler.
        {"series": f'ddp_phase_seconds_sum{{{JOB}, rank="1", phase="backward"}}', "values": "0+24x30"},
    ]
    _promtool_test(tmp_path, straggler, [_quiet("DDPJobStraggler", "8m"), _firing("DDPJobStraggler", "20m", **LABELS)])
    _promtool_test(tmp_path, _healthy_steps(30), [_quiet("DDPJobStraggler", "20m")])


def test_a_step_time_regression_against_the_jobs_own_median_fires(tmp_path: Path) -> None:
    # 0.1 s a step for an hour, then 0.3 s a step.
    slower = [
        {"series": f'ddp_step_seconds_count{{{JOB}, rank="0"}}', "values": "0+60x120"},
        {"series": f'ddp_step_seconds_sum{{{JOB}, rank="0"}}', "values": "0+6x60 378+18x60"},
    ]
    alerts = [_quiet("DDPJobStepTimeRegressed", "55m"), _firing("DDPJobStepTimeRegressed", "90m", **LABELS)]
    _promtool_test(tmp_path, slower, alerts)
    _promtool_test(tmp_path, _healthy_steps(120), [_quiet("DDPJobStepTimeRegressed", "90m")])


@pytest.mark.parametrize(
    ("last_step", "started"),
    [("60+0x30", "0+0x30"), ("0+0x30", "0+0x30")],
    ids=["stalled after a step", "never stepped since start"],
)
def test_no_progress_fires_when_no_rank_finished_a_step_for_ten_minutes(
    tmp_path: Path, last_step: str, started: str
) -> None:
    series = [
        {"series": f'ddp_last_step_timestamp_seconds{{{JOB}, rank="0"}}', "values": last_step},
        {"series": f'process_start_time_seconds{{{JOB}, rank="0"}}', "values": started},
    ]
    alerts = [_quiet("DDPJobNoProgress", "5m"), _firing("DDPJobNoProgress", "15m", severity="critical", **LABELS)]
    _promtool_test(tmp_path, series, alerts)


def test_no_progress_stays_quiet_while_steps_keep_finishing(tmp_path: Path) -> None:
    series = [{"series": f'ddp_last_step_timestamp_seconds{{{JOB}, rank="0"}}', "values": "0+60x30"}]
    _promtool_test(tmp_path, series, [_quiet("DDPJobNoProgress", "20m")])


def test_restarts_rising_counts_the_attempts_of_one_job(tmp_path: Path) -> None:
    series = [
        {"series": f'ddp_info{{{JOB}, rank="0", attempt="{attempt}"}}', "values": "_ " * (5 * attempt) + "1x5"}
        for attempt in range(4)
    ]
    alerts = [_quiet("DDPJobRestartsRising", "12m"), _firing("DDPJobRestartsRising", "18m", **LABELS)]
    _promtool_test(tmp_path, series, alerts)


def test_a_failed_job_fires_even_when_its_reason_is_seen_for_the_first_time(tmp_path: Path) -> None:
    series = [
        {"series": 'ddpjob_operator_jobs_failed_total{reason="BackoffLimitExceeded"}', "values": "_ _ _ _ _ 1x30"},
        {"series": "ddpjob_operator_jobs_succeeded_total", "values": "0+1x30"},
    ]
    alerts = [
        _quiet("DDPJobFailed", "3m"),
        _firing("DDPJobFailed", "8m", reason="BackoffLimitExceeded"),
        _quiet("DDPJobFailed", "30m"),
    ]
    _promtool_test(tmp_path, series, alerts)

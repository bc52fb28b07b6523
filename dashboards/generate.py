"""The DDPJob Grafana dashboard, built with the Grafana Foundation SDK (never edited by hand).

    python -m dashboards.generate           # writes helm/ddpjob/dashboards/ddpjob.json
    python -m dashboards.generate --check   # exits 1 when the committed JSON differs from the generator

Every query filters on the labels Prometheus attaches to each training pod's series: ``namespace``,
``ddpjob`` and ``rank`` (the box relabels ddpjob.dev/job-name and ddpjob.dev/rank the same way the
chart's PodMonitor does), so the dashboard works in both places.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.builders import dashboard as dash
from grafana_foundation_sdk.builders import prometheus, stat, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models.dashboard import (
    DashboardCursorSync,
    DataSourceRef,
    VariableRefresh,
    VariableSort,
)

from ddpjob_contract import metrics as m

OUTPUT = Path(__file__).resolve().parents[1] / "helm" / "ddpjob" / "dashboards" / "ddpjob.json"
UID = "ddpjob-training"
# The operator's gang-restart counter (operator/ddpjob_operator/metrics.py; a test checks the name).
OPERATOR_RESTARTS = "ddpjob_operator_jobs_restarted_total"

DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")
SEL = 'namespace="$namespace", ddpjob="$job"'
RATE = "$__rate_interval"
# Rank-local work per step: backward is left out, because DDP's all-reduce makes every rank wait there
# for the slowest one, which evens out whole-step times and hides the straggler.
LOCAL_WORK = (
    f'sum by (rank) (rate({m.PHASE_SECONDS}_sum{{{SEL}, phase!="backward"}}[{RATE}]))'
    f" / sum by (rank) (rate({m.STEP_SECONDS}_count{{{SEL}}}[{RATE}]))"
)


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str


@dataclass(frozen=True)
class PanelSpec:
    title: str
    description: str
    unit: str
    queries: tuple[Query, ...]
    kind: str = "timeseries"  # or "stat"
    width: int = 12
    stacked: bool = False


PANELS: tuple[PanelSpec, ...] = (
    PanelSpec(
        title="Samples/s (job)",
        description="Training throughput of the whole job: samples per second summed over ranks.",
        unit="short",
        kind="stat",
        width=6,
        queries=(Query(f"sum(rate({m.SAMPLES_TOTAL}{{{SEL}}}[{RATE}]))", "samples/s"),),
    ),
    PanelSpec(
        title="Slowest / fastest rank",
        description=(
            "Ratio of the slowest rank's data + forward + optimizer time per step to the fastest rank's. "
            "1.0 means balanced; a straggler pushes it up. Backward is left out: DDP's all-reduce makes "
            "every rank wait there for the slowest."
        ),
        unit="none",
        kind="stat",
        width=6,
        queries=(Query(f"max({LOCAL_WORK}) / min({LOCAL_WORK})", "slowest / fastest"),),
    ),
    PanelSpec(
        title="Time since last step",
        description="Seconds since each rank finished its last step; a growing value means the job is stuck.",
        unit="s",
        kind="stat",
        width=6,
        queries=(Query(f"time() - max by (rank) ({m.LAST_STEP_TIMESTAMP_SECONDS}{{{SEL}}})", "rank {{rank}}"),),
    ),
    PanelSpec(
        title="Restarts",
        description=(
            "Gang restarts of this job in the time range (every restart starts a new attempt, and every "
            "series carries the attempt label), and gang restarts done by the operator for all its jobs."
        ),
        unit="short",
        kind="stat",
        width=6,
        queries=(
            Query(
                f"count(count by (attempt) (max_over_time({m.INFO}{{{SEL}}}[$__range]))) - 1",
                "this job",
            ),
            Query(f"sum(increase({OPERATOR_RESTARTS}[$__range]))", "operator, all jobs"),
        ),
    ),
    PanelSpec(
        title="Step time p50 and p95 per rank",
        description="Wall time of one optimizer step (data wait included), from the ddp_step_seconds histogram.",
        unit="s",
        queries=tuple(
            Query(
                f"histogram_quantile({q}, sum by (rank, le) (rate({m.STEP_SECONDS}_bucket{{{SEL}}}[{RATE}])))",
                f"p{round(q * 100)} rank {{{{rank}}}}",
            )
            for q in (0.5, 0.95)
        ),
    ),
    PanelSpec(
        title="Time per step by phase",
        description=(
            "Mean seconds per step spent in each phase, averaged over ranks: data (waiting for the batch "
            "and copying it), forward, backward (with DDP's overlapped all-reduce) and optimizer."
        ),
        unit="s",
        stacked=True,
        queries=(
            Query(
                f"sum by ({m.PHASE_LABEL}) (rate({m.PHASE_SECONDS}_sum{{{SEL}}}[{RATE}]))"
                f" / sum by ({m.PHASE_LABEL}) (rate({m.PHASE_SECONDS}_count{{{SEL}}}[{RATE}]))",
                f"{{{{{m.PHASE_LABEL}}}}}",
            ),
        ),
    ),
    PanelSpec(
        title="Samples/s per job and per rank",
        description="Throughput of the job (sum) and of each rank.",
        unit="short",
        queries=(
            Query(f"sum(rate({m.SAMPLES_TOTAL}{{{SEL}}}[{RATE}]))", "job"),
            Query(f"sum by (rank) (rate({m.SAMPLES_TOTAL}{{{SEL}}}[{RATE}]))", "rank {{rank}}"),
        ),
    ),
    PanelSpec(
        title="Loss per rank",
        description="The last step's training loss on each rank (each rank's own batch; not averaged).",
        unit="none",
        queries=(Query(f"max by (rank) ({m.LOSS}{{{SEL}}})", "rank {{rank}}"),),
    ),
)


def _query(q: Query, ref: str) -> prometheus.Dataquery:
    return prometheus.Dataquery().expr(q.expr).legend_format(q.legend).ref_id(ref).datasource(DATASOURCE)


def _panel(spec: PanelSpec, panel_id: int) -> stat.Panel | timeseries.Panel:
    panel: stat.Panel | timeseries.Panel
    if spec.kind == "stat":
        panel = (
            stat.Panel()
            .graph_mode(common.BigValueGraphMode.AREA)
            .reduce_options(common_builders.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
            .height(5)
        )
    else:
        panel = (
            timeseries.Panel()
            .fill_opacity(10)
            .legend(
                common_builders.VizLegendOptions()
                .display_mode(common.LegendDisplayMode.LIST)
                .placement(common.LegendPlacement.BOTTOM)
                .show_legend(True)
            )
            .height(8)
        )
        if spec.stacked:
            panel = panel.stacking(common_builders.StackingConfig().mode(common.StackingMode.NORMAL))
    panel = panel.title(spec.title).description(spec.description).unit(spec.unit).span(spec.width)
    panel = panel.id(panel_id).datasource(DATASOURCE)
    for i, q in enumerate(spec.queries):
        panel = panel.with_target(_query(q, chr(ord("A") + i)))
    return panel


def build() -> dash.Dashboard:
    board = (
        dash.Dashboard("DDPJob training")
        .uid(UID)
        .description("PyTorch DDP training jobs run by the DDPJob operator: step time, phases, throughput, stragglers.")
        .tags(["ddpjob", "pytorch", "training"])
        .refresh("30s")
        .time("now-1h", "now")
        .timezone("browser")
        .tooltip(DashboardCursorSync.CROSSHAIR)
        .with_variable(dash.DatasourceVariable("datasource").label("Data source").type("prometheus"))
        .with_variable(
            dash.QueryVariable("namespace")
            .label("Namespace")
            .datasource(DATASOURCE)
            .query(f"label_values({m.INFO}, namespace)")
            .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
            .sort(VariableSort.ALPHABETICAL_ASC)
        )
        .with_variable(
            dash.QueryVariable("job")
            .label("DDPJob")
            .datasource(DATASOURCE)
            .query(f'label_values({m.INFO}{{namespace="$namespace"}}, ddpjob)')
            .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
            .sort(VariableSort.ALPHABETICAL_ASC)
        )
    )
    for panel_id, spec in enumerate(PANELS, start=1):
        board = board.with_panel(_panel(spec, panel_id))
    return board


def render() -> str:
    return json.dumps(json.loads(JSONEncoder().encode(build().build())), indent=2, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dashboards.generate", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the committed JSON differs; write nothing")
    parser.add_argument("--output", type=Path, default=OUTPUT, help=f"where to write (default: {OUTPUT})")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        if not args.output.exists() or args.output.read_text() != text:
            print(f"{args.output} is stale: run python -m dashboards.generate", file=sys.stderr)
            return 1
        return 0
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`eagleeye plan`: recommend a fault-tolerance strategy, redundancy and checkpoint period."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from eagleeye.commands._args import output_file


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from exc


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "plan",
        help="simulate checkpoint-only, replication and SPARe for a cluster and recommend one",
        description=(
            "Simulates the job (SimPy) under checkpoint-only, replication + checkpoint and "
            "SPARe + checkpoint, each with Saxena's availability-optimal checkpoint period, "
            "and recommends the lowest time-to-train. Prints a table; writes a PNG plot and "
            "optionally an HTML report."
        ),
    )
    p.add_argument("--gpus", type=int, required=True, help="GPUs in the job")
    p.add_argument(
        "--gpu-mtbf-hours",
        type=float,
        default=50_000.0,
        help="MTBF of one GPU in hours (default: 50000, Llama-3's rate)",
    )
    p.add_argument(
        "--groups",
        type=int,
        default=None,
        help="data-parallel groups N (default: one per 1000 GPUs)",
    )
    p.add_argument(
        "--restart-min",
        type=float,
        default=60.0,
        help="global restart time in minutes (default: 60)",
    )
    p.add_argument("--save-s", type=float, default=60.0, help="checkpoint save time (default: 60)")
    p.add_argument(
        "--layer-s",
        type=float,
        default=64.0,
        help="compute time of one stack layer in seconds (default: 64)",
    )
    p.add_argument(
        "--allreduce-s",
        type=float,
        default=None,
        help="all-reduce time in seconds (default: 0.01 s per group)",
    )
    p.add_argument("--steps", type=int, default=10_000, help="training steps (default: 10000)")
    p.add_argument(
        "--weibull-shape",
        type=float,
        default=0.78,
        help="Weibull shape of failure gaps; 1 = exponential (default: 0.78)",
    )
    p.add_argument("--seeds", type=int, default=1, help="simulations per candidate (default: 1)")
    p.add_argument(
        "--replication-r",
        type=_ints,
        default=(2, 3, 4),
        help="replication degrees to try (default: 2,3,4)",
    )
    p.add_argument(
        "--spare-r",
        type=_ints,
        default=None,
        help="SPARe redundancies to try (default: r*-3 … r*+2)",
    )
    p.add_argument(
        "--replica-stall-min",
        type=float,
        default=3.0,
        help="FT-HSDP: whole-job stall per failure in minutes (default: 3)",
    )
    p.add_argument(
        "--replica-rejoin-min",
        type=float,
        default=7.0,
        help="FT-HSDP: minutes until the failed replica trains again (default: 7)",
    )
    p.add_argument(
        "--plot",
        type=output_file,
        default=Path("plan.png"),
        help="PNG plot to write (default: plan.png)",
    )
    p.add_argument("--html", type=output_file, default=None, help="also write an HTML report here")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bars")
    p.set_defaults(func=_plan)


def _plan(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import Progress

    from ft_runtime.planner.plan import PlanRequest, candidates, make_plan
    from ft_runtime.planner.report import summary, text_table, write_html, write_png

    req = PlanRequest(
        gpus=args.gpus,
        gpu_mtbf_hours=args.gpu_mtbf_hours,
        n_groups=args.groups,
        restart_min=args.restart_min,
        save_s=args.save_s,
        layer_s=args.layer_s,
        allreduce_s=args.allreduce_s,
        steps=args.steps,
        weibull_shape=args.weibull_shape,
        seeds=args.seeds,
        replication_r=args.replication_r,
        spare_r=args.spare_r,
        replica_stall_min=args.replica_stall_min,
        replica_rejoin_min=args.replica_rejoin_min,
    )
    console = Console()
    total = len(candidates(req.cluster(), req))
    with Progress(console=console, disable=args.no_progress, transient=True) as bars:
        overall = bars.add_task("candidates", total=total)
        current: dict[str, Any] = {}

        def progress(label: str, fraction: float) -> None:
            if label not in current:
                current[label] = bars.add_task(label, total=1.0)
                if len(current) > 1:
                    bars.advance(overall)
            bars.update(current[label], completed=fraction)

        plan = make_plan(req, progress)
        bars.update(overall, completed=total)
    print(text_table(plan))
    print(summary(plan))
    print(f"plot: {write_png(plan, args.plot)}")
    if args.html is not None:
        print(f"report: {write_html(plan, args.html)}")
    return 0

"""`eagleeye demo`: the reference workload with an injected fault, detected and remediated."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from eagleeye.commands._args import whole


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "demo",
        help="train the reference model on 4 ranks, kill one, watch Eagle Eye recover",
        description=(
            "Trains the reference GPT on 2 replicas of 2 ranks, SIGKILLs one rank mid-run, "
            "lets the controller detect and remediate it, then prints a summary comparing the "
            "final loss with a fault-free reference run."
        ),
    )
    p.add_argument("--steps", type=whole, default=160, help="training steps (default: 160)")
    p.add_argument("--kill-rank", type=whole, default=3, help="rank to SIGKILL (default: 3)")
    p.add_argument(
        "--kill-step",
        type=whole,
        default=None,
        help="step at which to kill it (default: 45%% of the steps)",
    )
    p.add_argument(
        "--no-reference",
        action="store_true",
        help="skip the fault-free reference run (faster; no loss comparison)",
    )
    p.add_argument("--runs-dir", default="runs", help="directory of run folders (default: runs)")
    p.add_argument("--seed", type=int, default=0, help="training seed (default: 0)")
    p.add_argument(
        "--recovery",
        choices=("replica", "job"),
        default="replica",
        help="replica isolation (default) or the synchronous full restart, for comparison",
    )
    p.add_argument(
        "--policy",
        default=None,
        metavar="FILE",
        help="remediation policy (TOML); default: the built-in file of the recovery mode",
    )
    p.add_argument(
        "--local-agents",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run the ranks through one `eagleeye agent` per virtual node on this machine "
        "(the cluster path; the default); --no-local-agents: the ranks are the run's own "
        "children",
    )
    p.set_defaults(func=_demo)


def _demo(args: argparse.Namespace) -> int:
    from eagleeye.demo import DemoConfig, DemoStopped, run_demo

    try:
        report = run_demo(
            DemoConfig(
                steps=args.steps,
                kill_rank=args.kill_rank,
                kill_step=args.kill_step,
                reference=not args.no_reference,
                runs_dir=args.runs_dir,
                seed=args.seed,
                policy=args.policy,
                recovery=args.recovery,
                local_agents=args.local_agents,
            )
        )
    except DemoStopped as stop:
        print(f"eagleeye demo: {stop}", file=sys.stderr)
        return 128 + stop.signal
    return 0 if report.succeeded else 1

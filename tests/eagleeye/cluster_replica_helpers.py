"""What the replica-across-hosts tests share: the ranks' script and reading its log.

The script trains a tiny model through the replica library, printing ``step N`` after
each committed step, until the step named in the file given as its argument (written by
the test once it has seen what it waits for; every replica reads it, so all stop at the
same step)."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

from eagleeye.store import RunReader

SCRIPT = """
import os, sys, time
import torch
from ft_runtime import replica

torch.set_num_threads(1)
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)


def state_dict():
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict()}


def load(state):
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])


manager = replica.Manager(state_dict, load)
optimizer = replica.OptimizerWrapper(manager, optimizer)
x = torch.ones(8, 4)
while True:
    optimizer.zero_grad()
    model(x).sum().backward()
    time.sleep(0.05)
    optimizer.step()
    step = manager.current_step()
    print(f"step {step}", flush=True)
    try:
        end = int(open(sys.argv[1]).read())
    except (OSError, ValueError):
        end = None
    if end is not None and step >= end:
        break
manager.close()
"""

SAVING = SCRIPT.replace(
    "manager = replica.Manager(state_dict, load)",
    """

def save(step):
    folder = os.path.join(os.path.dirname(sys.argv[1]), "saved")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"step-{step}.pt")
    torch.save({**state_dict(), "manager": manager.state_dict()}, path)
    print(f"saved step {step}", flush=True)
    return path


manager = replica.Manager(state_dict, load, save_checkpoint=save)""",
)
"""The script with ``save_checkpoint``: the controller's ``checkpoint`` command saves the
step just committed to ``saved/step-N.pt`` beside the finish file."""


def steps(log: Path) -> list[int]:
    """The steps a rank's log says it committed, in order."""
    text = log.read_text() if log.exists() else ""
    return [int(n) for n in re.findall(r"^step (\d+)$", text, re.MULTILINE)]


def answered(run: RunReader) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The run's findings and actions, less the hangs the stall limit may find first when
    a rank's host goes (its fencing, an ``isolate``): a lost host's replica is late in the
    exchange before its host is found lost, and both end in the same recovery."""
    findings, actions = run.findings(), run.actions()
    findings = findings[findings["kind"] != "hang"].reset_index(drop=True)
    actions = actions[actions["finding_kind"] != "hang"].reset_index(drop=True)
    return findings, actions

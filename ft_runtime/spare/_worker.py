"""One SPARe group of the exact-gradient harness: a single gloo rank in its own process.

Run as ``python -m ft_runtime.spare._worker HOST PORT GROUP CONFIG_JSON``. Each step the
group sums the gradients of the shard types its plan assigns it, all-reduces the sum over
the current generation's process group and applies ḡ = Σ / N. When the all-reduce fails
(a peer died), it waits for the controller's next plan, joins a new process group under a
new store prefix, patch-computes the types it was newly assigned (reusing those it already
computed this step) and retries the same step, so no update is lost or doubled. After a
wipe-out the survivors exit; the harness relaunches every group from the last checkpoint
(written every ``ckpt_every`` steps by the lowest surviving group, loaded with
``weights_only=True``).
"""

from __future__ import annotations

import json
import os
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
from torch._C._distributed_c10d import PrefixStore, ProcessGroupGloo, Store, TCPStore

from ft_runtime.spare._model import init_params, shard_grad

EXIT_WIPE_OUT = 3
CKPT_NAME = "spare-ckpt.pt"


def _plan(store: Store, gen: int) -> dict[str, Any]:
    plan: dict[str, Any] = json.loads(store.get(f"plan/{gen}").decode())
    return plan


def _group(store: Store, gen: int, plan: dict[str, Any], me: int, timeout: float) -> Any:
    members: list[int] = plan["members"]
    gloo: Any = ProcessGroupGloo  # _Options is public in use but absent from the stubs
    opts = gloo._Options()
    opts._devices = [gloo.create_device(hostname="127.0.0.1")]
    # Joining waits for survivors still stuck in the old collective (up to its timeout).
    opts._timeout = timedelta(seconds=4 * timeout)
    prefixed = PrefixStore(f"gen{gen}", store)
    pg = ProcessGroupGloo(prefixed, members.index(me), len(members), opts)
    pg.set_timeout(timedelta(seconds=timeout))
    return pg


def _resume(cfg: dict[str, Any]) -> tuple[int, torch.Tensor]:
    """The last checkpoint (steps done, parameters), or step 0 and the initial parameters."""
    path = Path(cfg["ckpt_dir"]) / CKPT_NAME
    if cfg["attempt"] > 0 and path.exists():
        state = torch.load(path, weights_only=True)
        return int(state["step"]), state["params"]
    return 0, init_params(cfg["seed"], cfg["dim"])


def _save(cfg: dict[str, Any], step: int, params: torch.Tensor) -> None:
    # Write then rename, so a kill mid-write never leaves a torn checkpoint behind.
    path = Path(cfg["ckpt_dir"]) / CKPT_NAME
    tmp = path.with_suffix(".tmp")
    torch.save({"step": torch.tensor(step), "params": params}, tmp)
    os.replace(tmp, path)


def main(argv: list[str]) -> int:
    host, port, me, cfg = argv[0], int(argv[1]), int(argv[2]), json.loads(argv[3])
    n, seed, batch, dim = cfg["n_groups"], cfg["seed"], cfg["batch"], cfg["dim"]
    park = {int(s) for s, g in cfg["kills"] if g == me}
    ns = f"a{cfg['attempt']}/"  # every restart attempt has its own keys in the store
    store = PrefixStore(ns, TCPStore(host, port, is_master=False, timeout=timedelta(seconds=120)))
    step, params = _resume(cfg)
    gen, plan = 0, _plan(store, 0)
    pg = _group(store, gen, plan, me, cfg["timeout_s"])
    cache: dict[int, torch.Tensor] = {}
    while step < cfg["steps"]:
        for t in plan["computes"][str(me)]:
            if t not in cache:  # patch compute: only types not already computed this step
                cache[t] = shard_grad(params, seed, step, t, batch, dim)
        total = torch.zeros_like(params)
        for t in plan["computes"][str(me)]:
            total += cache[t]
        if step in park:
            # Fault injection: stop after computing, so the SIGKILL lands mid-step.
            store.set(f"computed/{step}/{me}", "1")
            store.get(f"never/{step}")
        try:
            pg.allreduce([total]).wait()
        except RuntimeError:
            gen += 1
            plan = _plan(store, gen)
            if plan["wipe_out"]:
                return EXIT_WIPE_OUT
            pg = _group(store, gen, plan, me, cfg["timeout_s"])
            continue
        params = params - cfg["lr"] * total / n
        step, cache = step + 1, {}
        if step % cfg["ckpt_every"] == 0 and me == plan["members"][0]:
            _save(cfg, step, params)
    store.set(f"result/{me}", params.numpy().tobytes().hex())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

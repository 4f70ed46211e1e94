"""How the leave-one-category-out protocol chooses constants on the other categories.

detectors/eval/nab_loco.py chooses, for each held-out category, the setting that scores
best on the other five. "Best" can be judged three ways (``nab_loco.SELECTIONS``): their
files' verdicts normalised together (``pooled``, NAB's corpus score, the default), the
mean of their per-category scores (``mean``: each category one vote, the statistic the
held-out mean reports) or the worst of them (``min``: the setting that does least badly
on the kind of series it suits least). The families' score tables are computed once and
every selection is run on them; every held-out category and the mean are printed.

With ``--sustain-off``, the record detector's grid gains one value of the sustained
trigger's z, infinity (the trigger off: on the whole corpus it made 37 of AWS
CloudWatch's 56 false positives), and every selection is run twice: on the shipped grid
and on the grid with that value, chosen like any other constant on the other categories.

Run: .venv/bin/python benchmarks/nab_selection.py [--root ../shared/data/nab]
     [--family record fusion] [--sustain-off] [--json FILE]
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from pathlib import Path

from detectors.eval import nab_loco
from detectors.eval.nab_corpus import load_corpus
from detectors.eval.nab_families import FusionFamily, RecordFamily
from detectors.eval.nab_loco import SELECTIONS, held_out, score_table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path("../shared/data/nab"))
    parser.add_argument("--family", nargs="+", default=["record", "fusion"])
    parser.add_argument("--sustain-off", action="store_true")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    shipped = dict(nab_loco.GRID)
    if args.sustain_off:  # RecordFamily reads the grid when asked for its settings
        nab_loco.GRID = {**shipped, "sustain_z": (*shipped["sustain_z"], float("inf"))}
    at = list(nab_loco.GRID).index("sustain_z")
    files = list(load_corpus(args.root))
    record = RecordFamily()  # its flags are cached and shared with the fusion family
    families = {"record": record, "fusion": FusionFamily(record)}
    out: dict[str, dict[str, object]] = {}
    for name in args.family:
        start = time.perf_counter()
        table = score_table(files, families[name])
        print(f"# {name}: {len(table)} settings scored in {time.perf_counter() - start:.0f} s")
        offset = 0 if name == "record" else 4  # a fusion setting: rule, CAD's three, record's
        grids = {"shipped grid": {k: v for k, v in table.items() if k[offset + at] < float("inf")}}
        if args.sustain_off:
            grids["grid with the sustained trigger off"] = table
        for (grid, sub), select in itertools.product(grids.items(), SELECTIONS):
            result = held_out(files, sub, select)
            print(f"## {name}, {grid} ({len(sub)} settings), chosen by {select}")
            for h in result.held:
                print(
                    f"{h.profile:<20}{h.category:<24}{h.score:8.2f} (HTM {h.htm:6.2f})"
                    f"{h.false_positives:5d} FP  setting {h.setting}"
                )
            for p in result.mean:
                print(f"{p:<20}mean {result.mean[p]:.2f}  pooled {result.pooled[p]:.2f}")
            out[f"{name}/{grid}/{select}"] = {
                "held": [h.__dict__ for h in result.held],
                "mean": dict(result.mean),
                "pooled": dict(result.pooled),
            }
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()

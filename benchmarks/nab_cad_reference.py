"""CAD OSE as NAB ran it: a check of detectors/cad.py against NAB's published contextOSE.

NAB gives each detector the file's minimum and maximum (a look-ahead: the range includes
the anomalies to come) and sweeps one threshold per profile over the whole corpus. This
script does the same with our implementation: the file's range, the rest period a fifth of
the probation, the published code's skipping of context 0 (``as_published``), and
contextOSE's published thresholds (NAB's
results/contextOSE/contextOSE_<profile>_scores.csv: 0.7655 standard, 0.7656 low FP,
0.7048 low FN), and prints each category's normalised score and the corpus's. It is a
reproduction check, not a streaming or held-out figure: for those, `eagleeye eval nab
--loco --family cad`.

Run: .venv/bin/python benchmarks/nab_cad_reference.py [--root ../shared/data/nab]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from detectors.cad import cad_scores, rest_filter
from detectors.eval.nab import PROFILES, FileScore, normalised_score, probation_length, score_file
from detectors.eval.nab_corpus import load_corpus
from detectors.eval.nab_loco import _score, category

#: contextOSE's thresholds in NAB's published results, per profile.
THRESHOLDS = {
    "standard": 0.76552734375,
    "reward_low_FP_rate": 0.765637207031,
    "reward_low_FN_rate": 0.70478515625,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path("..") / "shared" / "data" / "nab")
    args = parser.parse_args()
    files = list(load_corpus(args.root))
    start = time.perf_counter()
    raws = [
        cad_scores(f.values, float(np.min(f.values)), float(np.max(f.values)), as_published=True)
        for f in files
    ]
    seconds = time.perf_counter() - start
    for p in PROFILES:
        per: dict[str, list[FileScore]] = {}
        for f, raw in zip(files, raws, strict=True):
            probation = probation_length(len(f.values))
            kept = rest_filter(raw, 0.75, int(probation / 5))
            per.setdefault(category(f.name), []).append(
                score_file(kept >= THRESHOLDS[p.name], f.windows, p)
            )
        every = [s for scores in per.values() for s in scores]
        cells = "  ".join(f"{c} {_score(per[c], p):.2f}" for c in sorted(per))
        fp = sum(s.fp for s in every)
        print(f"{p.name}: {cells}  corpus {normalised_score(every, p):.2f}  FP {fp}")
    print(f"{seconds:.0f} s for {len(files)} files")


if __name__ == "__main__":
    main()

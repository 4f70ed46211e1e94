"""Split-half check of the univariate detector's constants on the NAB corpus.

The files of windows.json are dealt alternately into two halves. For each setting of a
grid over six of RecordDetector's constants the NAB standard score is computed on each
half and on the whole corpus; the setting that is best on one half is then scored on the
other, so the figure is not merely fitted to the files it is reported on.

Run: .venv/bin/python benchmarks/nab_split_half.py [--root ../shared/data/nab]
"""

from __future__ import annotations

import argparse
import itertools
import statistics
from pathlib import Path

from detectors.eval.nab import STANDARD, FileScore, normalised_score, probation_length, score_file
from detectors.eval.nab_corpus import NabFile, load_corpus
from detectors.eval.nab_loco import GRID, detector_for

Setting = tuple[float, ...]


def _scores(files: list[NabFile], setting: Setting) -> list[FileScore]:
    out = []
    for f in files:
        probation = probation_length(len(f.values))
        flags = detector_for(setting, probation).detect(f.values, probation).flags
        out.append(score_file(flags, f.windows, STANDARD))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path("..") / "shared" / "data" / "nab")
    args = parser.parse_args()
    files = list(load_corpus(args.root))
    results: list[tuple[float, float, float, Setting]] = []
    for setting in itertools.product(*GRID.values()):
        scores = _scores(files, setting)
        a, b = scores[0::2], scores[1::2]
        results.append(
            (
                normalised_score(a, STANDARD),
                normalised_score(b, STANDARD),
                normalised_score(scores, STANDARD),
                setting,
            )
        )
    names = ", ".join(GRID)
    on_a = max(results, key=lambda r: r[0])
    on_b = max(results, key=lambda r: r[1])
    best = max(results, key=lambda r: r[2])
    print(
        f"{len(results)} settings of ({names}); halves of {len(files[0::2])} and "
        f"{len(files[1::2])} files"
    )
    print(f"tuned on half A: {on_a[0]:.2f} there, {on_a[1]:.2f} on half B  {on_a[3]}")
    print(f"tuned on half B: {on_b[1]:.2f} there, {on_b[0]:.2f} on half A  {on_b[3]}")
    print(f"best on the whole corpus: {best[2]:.2f}  {best[3]}")
    print(f"median setting on the whole corpus: {statistics.median(r[2] for r in results):.2f}")


if __name__ == "__main__":
    main()

"""The controller as the chaos harness starts it, a process of its own: what
``eagleeye run`` does, for a job given as JSON (snapshot holders included, which
``eagleeye run`` has no flag for), or ``--resume RUN_DIR``.

    python -m tests.eagleeye.chaos_controller '{"script": ..., "layout": {...}, ...}'
    python -m tests.eagleeye.chaos_controller --resume RUN_DIR
"""

from __future__ import annotations

import json
import sys

from eagleeye.console import LiveLog
from eagleeye.launch import JobConfig, resumed_job_config, run_job
from ft_runtime.layout import JobLayout


def main(argv: list[str]) -> int:
    if argv[0] == "--resume":
        config = resumed_job_config(argv[1], stream_ranks=())
    else:
        fields = json.loads(argv[0])
        fields["layout"] = JobLayout(**fields["layout"])
        config = JobConfig(**fields)
    live = LiveLog()
    result = run_job(config, on_update=live)
    stopped = result.report.stopped
    live.console.print(f"run {'succeeded' if result.succeeded else 'failed'}")
    if stopped is not None:
        return 128 + stopped.signal
    return 0 if result.succeeded else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""``python -m ft_runtime.ckpt``: runs one node's snapshot holder (see holder.main)."""

from __future__ import annotations

import logging
import os
import sys

from ft_runtime.ckpt.holder import main

code = main()
# By now the holder has released all it owns (segments deleted, sockets closed). The
# interpreter's own teardown (torch's modules freed one by one) would take the holder
# most of a second more to exit, a second the job's end waits for each holder; skip it.
logging.shutdown()
sys.stdout.flush()
sys.stderr.flush()
os._exit(code)

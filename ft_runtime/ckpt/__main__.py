"""``python -m ft_runtime.ckpt``: runs one node's snapshot holder (see holder.main)."""

from __future__ import annotations

import sys

from ft_runtime.ckpt.holder import main

sys.exit(main())

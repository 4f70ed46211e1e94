from __future__ import annotations

import sys

from eagleeye.cli import main

sys.exit(main())

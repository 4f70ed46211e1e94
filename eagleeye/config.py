"""Environment variables through which the launcher configures a rank's Eagle Eye session.

Precedence everywhere: explicit argument > environment variable > config file > default.
"""

from __future__ import annotations

ENV_TELEMETRY = "EAGLEEYE_TELEMETRY"
"""ZeroMQ address of the controller's telemetry receiver; unset means no telemetry."""
ENV_TELEMETRY_KEY = "EAGLEEYE_TELEMETRY_KEY"
"""The job's telemetry key (hex); ranks sign every message with it, the controller drops
messages without a valid signature. Unset: messages go unsigned."""
ENV_CHECKPOINT_DIR = "EAGLEEYE_CHECKPOINT_DIR"
"""Directory of the job's checkpoints."""
ENV_RUN_DIR = "EAGLEEYE_RUN_DIR"
"""The run's folder (store, logs, checkpoints)."""
ENV_CHECKPOINT_KEEP = "EAGLEEYE_CHECKPOINT_KEEP"
"""How many complete checkpoints to retain (default 2)."""

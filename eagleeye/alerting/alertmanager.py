"""Alertmanager configuration, generated: alerts labelled ``remediate="true"`` go to Eagle
Eye's webhook (with its bearer token); the rest go to an optional notification webhook
for people, or nowhere.

Short ``group_wait`` and ``group_interval`` make remediation prompt; Alertmanager's
defaults (30 s and 5 min) suit paging people, not fixing a job.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from eagleeye.errors import EagleEyeError

REMEDIATION = "eagleeye-remediation"
NOTIFY = "eagleeye-notify"
GROUP_BY = ["alertname", "kind", "node", "gpu", "rank", "replica"]


def alertmanager_config(
    webhook_url: str,
    token: str,
    notify_url: str | None = None,
    group_wait: str = "1s",
    group_interval: str = "5s",
    repeat_interval: str = "1h",
) -> dict[str, Any]:
    """The configuration as a mapping.

    Args:
        webhook_url: Eagle Eye's webhook (``AlertWebhook.url``).
        token: the webhook's bearer token.
        notify_url: a webhook for people (chat, pager bridge); alerts are dropped without it.

    Raises:
        EagleEyeError: an empty token or a URL that is not http(s).
    """
    if not token:
        raise EagleEyeError("the webhook needs a token: pass --token or set EAGLEEYE_TOKEN")
    for url in (webhook_url, notify_url or "http://x"):
        if not url.startswith(("http://", "https://")):
            raise EagleEyeError(f"webhook URL {url!r} must start with http:// or https://")
    bearer = {"authorization": {"type": "Bearer", "credentials": token}}
    notify: dict[str, Any] = {"name": NOTIFY}
    if notify_url:
        notify["webhook_configs"] = [{"url": notify_url, "send_resolved": True}]
    return {
        "route": {
            "receiver": NOTIFY,
            "group_by": GROUP_BY,
            "group_wait": group_wait,
            "group_interval": group_interval,
            "repeat_interval": repeat_interval,
            "routes": [
                {
                    "receiver": REMEDIATION,
                    "matchers": ['remediate="true"'],
                    "continue": True,  # people hear about it too
                },
                {"receiver": NOTIFY, "matchers": ['remediate=~".*"']},
            ],
        },
        "receivers": [
            {
                "name": REMEDIATION,
                "webhook_configs": [
                    {"url": webhook_url, "send_resolved": False, "http_config": bearer}
                ],
            },
            notify,
        ],
        # A fatal XID makes the node's other alerts noise until it is evicted.
        "inhibit_rules": [
            {
                "source_matchers": ['kind="xid"', 'severity="critical"'],
                "target_matchers": ['severity=~"warn|info"'],
                "equal": ["node"],
            }
        ],
    }


def write_alertmanager_config(path: str | Path, **kwargs: Any) -> Path:
    """Writes the configuration (JSON, which Alertmanager reads as YAML), readable only by
    its owner since it holds the token."""
    path = Path(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        json.dump(alertmanager_config(**kwargs), out, indent=2)
        out.write("\n")
    return path

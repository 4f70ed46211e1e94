"""Alertmanager configuration, generated: alerts labelled ``remediate="true"`` go to Eagle
Eye's webhook (with its bearer token, read by Alertmanager from a file); the rest go to an
optional notification webhook for people, or nowhere.

The config holds no secret: ``credentials_file`` names the file with the alert token. That
token lets Alertmanager send alerts and nothing else; approving pending actions takes a
second token (``AlertWebhook(approval_token=...)``) that Alertmanager never sees.

Short ``group_wait`` and ``group_interval`` make remediation prompt; Alertmanager's
defaults (30 s and 5 min) suit paging people, not fixing a job. Alerts are grouped per
job, run, host, GPU and rank, so two jobs' alerts never merge; a fatal XID inhibits the
warnings of its own host only (``Hostname``, dcgm-exporter's label).
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path
from typing import Any

from eagleeye.errors import EagleEyeError

REMEDIATION = "eagleeye-remediation"
NOTIFY = "eagleeye-notify"
GROUP_BY = ["alertname", "job", "run", "kind", "Hostname", "node", "gpu", "rank", "replica"]
#: The label dcgm-exporter puts the host in; inhibition compares it.
HOST_LABEL = "Hostname"


def alertmanager_config(
    webhook_url: str,
    credentials_file: str | Path,
    notify_url: str | None = None,
    group_wait: str = "1s",
    group_interval: str = "5s",
    repeat_interval: str = "1h",
) -> dict[str, Any]:
    """The configuration as a mapping.

    Args:
        webhook_url: Eagle Eye's webhook (``AlertWebhook.url``).
        credentials_file: the file holding the webhook's alert token (absolute in the
            config: Alertmanager resolves it against its own working directory otherwise).
        notify_url: a webhook for people (chat, pager bridge); alerts are dropped without it.

    Raises:
        EagleEyeError: no credentials file or a URL that is not http(s).
    """
    if not str(credentials_file):
        raise EagleEyeError("the webhook needs a token file: pass --token-file")
    for url in (webhook_url, notify_url or "http://x"):
        if not url.startswith(("http://", "https://")):
            raise EagleEyeError(f"webhook URL {url!r} must start with http:// or https://")
    bearer = {
        "authorization": {
            "type": "Bearer",
            "credentials_file": str(Path(credentials_file).resolve()),
        }
    }
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
        # A fatal XID makes the host's other alerts noise until it is evicted.
        "inhibit_rules": [
            {
                "source_matchers": ['kind="xid"', 'severity="critical"'],
                "target_matchers": ['severity=~"warning|info"'],
                "equal": [HOST_LABEL],
            }
        ],
    }


def write_token_file(path: str | Path) -> Path:
    """A new random token in ``path``, readable only by its owner (the file must not exist).

    Raises:
        EagleEyeError: the file exists already.
    """
    path = Path(path)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise EagleEyeError(
            f"token file {path} exists; keep it, or remove it for a new one"
        ) from None
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(secrets.token_urlsafe(32) + "\n")
    return path


def read_token_file(path: str | Path) -> str:
    """The token in ``path`` (surrounding whitespace stripped), as Alertmanager reads it.

    Raises:
        EagleEyeError: the file is missing or empty.
    """
    try:
        token = Path(path).read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise EagleEyeError(f"cannot read token file {path}: {exc.strerror}") from None
    if not token:
        raise EagleEyeError(f"token file {path} is empty; write a token into it")
    return token


def write_alertmanager_config(path: str | Path, **kwargs: Any) -> Path:
    """Writes the configuration (JSON, which Alertmanager reads as YAML); it names the
    token file and holds no secret."""
    path = Path(path)
    path.write_text(json.dumps(alertmanager_config(**kwargs), indent=2) + "\n", encoding="utf-8")
    return path

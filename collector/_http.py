"""HTTP GET with errors that say what went wrong and what to do (stdlib urllib only)."""

from __future__ import annotations

import urllib.error
import urllib.parse
import urllib.request

from collector.errors import CollectorError

#: Bodies larger than this are refused: a scrape that big is a misconfigured target.
MAX_BODY_BYTES = 64 * 1024 * 1024


class HTTPSourceError(CollectorError):
    """A URL that could not be read: unreachable, refused, or answered with an error."""


def get(url: str, *, timeout: float, params: dict[str, str] | None = None) -> tuple[int, bytes]:
    """Fetches ``url`` and returns (status, body); HTTP error statuses are returned, not raised.

    Raises:
        HTTPSourceError: the URL is not http(s), the server is unreachable, or the body is
            larger than ``MAX_BODY_BYTES``.
    """
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise HTTPSourceError(f"{url!r} is not an http:// or https:// URL")
    if params:
        url = f"{url}{'&' if parts.query else '?'}{urllib.parse.urlencode(params)}"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 (checked)
            return response.status, _read(response, url)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(MAX_BODY_BYTES)
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise HTTPSourceError(
            f"cannot reach {url}: {reason}; check the address and that the server is running"
        ) from exc


def _read(response: object, url: str) -> bytes:
    body: bytes = response.read(MAX_BODY_BYTES + 1)  # type: ignore[attr-defined]
    if len(body) > MAX_BODY_BYTES:
        raise HTTPSourceError(f"{url} returned more than {MAX_BODY_BYTES} bytes; refusing it")
    return body

"""TLS for Eagle Eye's HTTP endpoints (the metrics and Alertmanager's webhook).

Off loopback, ``--tls-cert FILE --tls-key FILE`` serves both over HTTPS with that
certificate (PEM); Prometheus and Alertmanager then use ``scheme: https`` and the CA that
signed it (``tls_config.ca_file``). Telemetry and control between processes are not HTTP:
they are authenticated by the run's shared secret (an HMAC on every message) instead.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

from eagleeye.errors import EagleEyeError


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """A server certificate (chain) and its private key, both PEM files."""

    cert: str
    key: str

    def context(self) -> ssl.SSLContext:
        """A server context of TLS 1.2 or newer with this certificate.

        Raises:
            EagleEyeError: a file is missing, or the pair cannot be loaded.
        """
        for what, path in (("--tls-cert", self.cert), ("--tls-key", self.key)):
            if not Path(path).is_file():
                raise EagleEyeError(f"{what} {path}: no such file; give a PEM file")
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            context.load_cert_chain(self.cert, self.key)
        except (ssl.SSLError, OSError) as exc:
            raise EagleEyeError(
                f"cannot load the certificate {self.cert} with the key {self.key}: {exc}; "
                "give a PEM certificate and its matching private key"
            ) from None
        return context


def tls_files(cert: str | None, key: str | None) -> TlsFiles | None:
    """The pair given on the command line; one without the other is an error."""
    if cert is None and key is None:
        return None
    if cert is None or key is None:
        raise EagleEyeError("--tls-cert and --tls-key go together; give both, or neither")
    return TlsFiles(cert, key)


__all__ = ["TlsFiles", "tls_files"]

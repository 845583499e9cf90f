"""Throwaway TLS certificates for test servers, made with the `openssl` command."""

from __future__ import annotations

import subprocess
from pathlib import Path


def _openssl(*args: object) -> None:
    subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True)


def certificates(directory: Path, subject_alt_name: str = "IP:127.0.0.1") -> tuple[Path, Path, Path]:
    """A CA of its own and a server certificate it signed for `subject_alt_name`: (ca, cert, key).

    Each call makes a new CA, so the CA of one call does not verify the certificate of another."""
    directory.mkdir(parents=True, exist_ok=True)
    ca, ca_key, cert, key, csr, ext = (
        directory / n for n in ("ca.pem", "ca.key", "server.pem", "server.key", "s.csr", "s.ext")
    )
    ext.write_text(f"subjectAltName={subject_alt_name}\n")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", ca_key, "-out", ca, "-days", "2",
             "-subj", f"/CN=ingest test CA {directory.name}")  # fmt: skip
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", csr, "-subj", "/CN=ingest test server")
    _openssl("x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial", "-out", cert,
             "-days", "2", "-extfile", ext)  # fmt: skip
    return ca, cert, key

"""Throwaway certificate authorities and certificates, made with the ``openssl`` command, for TLS between the
local cluster's scheduler loop and the extender (tests and benchmarks).

Two kinds of key: ECDSA P-256, and RSA 2048, which cert-manager and kubeadm issue when not told otherwise.
"""

from __future__ import annotations

import ssl
import subprocess
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path


class KeyKind(StrEnum):
    ECDSA = "ecdsa"
    RSA = "rsa"


_NEW_KEY = {KeyKind.ECDSA: ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"),
            KeyKind.RSA: ("-newkey", "rsa:2048")}


def _openssl(*args: str | Path) -> None:
    try:
        subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True)
    except FileNotFoundError:
        raise RuntimeError("The openssl command is needed to make test certificates and was not found; install "
                           "OpenSSL.") from None
    except subprocess.CalledProcessError as exc:
        raise RuntimeError(f"openssl {args[0]} failed: {exc.stderr.decode(errors='replace').strip()}") from None


@dataclass(frozen=True)
class Issued:
    """A certificate and its private key, as PEM files."""

    cert: Path
    key: Path


def make_ca(folder: Path, name: str, key: KeyKind = KeyKind.ECDSA, days: int = 1) -> Issued:
    """A self-signed CA valid for ``days``, its files ``{name}.crt`` and ``{name}.key`` in ``folder``."""
    ca = Issued(folder / f"{name}.crt", folder / f"{name}.key")
    _openssl("req", "-x509", *_NEW_KEY[key], "-nodes", "-days", str(days), "-keyout", ca.key, "-out", ca.cert,
             "-subj", f"/CN={name}")
    return ca


def issue(ca: Issued, folder: Path, name: str, serial: int, server: bool, key: KeyKind = KeyKind.ECDSA,
          days: int = 1) -> Issued:
    """A leaf certificate from ``ca``, valid for ``days``; a server one names 127.0.0.1, where the loop dials."""
    leaf = Issued(folder / f"{name}.crt", folder / f"{name}.key")
    request, extensions = folder / f"{name}.csr", folder / f"{name}.ext"
    _openssl("req", *_NEW_KEY[key], "-nodes", "-keyout", leaf.key, "-out", request, "-subj", f"/CN={name}")
    extensions.write_text("subjectAltName=IP:127.0.0.1\n" if server else "basicConstraints=CA:FALSE\n")
    _openssl("x509", "-req", "-in", request, "-CA", ca.cert, "-CAkey", ca.key, "-set_serial", str(serial),
             "-days", str(days), "-out", leaf.cert, "-extfile", extensions)
    request.unlink()
    extensions.unlink()
    return leaf


def client_context(trusted: Issued, identity: Issued | None) -> ssl.SSLContext:
    """A client's context that trusts ``trusted`` (a CA) and presents ``identity``'s certificate, if given one."""
    context = ssl.create_default_context(cafile=str(trusted.cert))
    if identity is not None:
        context.load_cert_chain(identity.cert, identity.key)
    return context

"""When the certificates of a PEM file stop being valid: the one fact of X.509 the extender reports itself.

Python's ``ssl`` decodes a certificate only once a handshake verified it, or a CA certificate loaded as a trust
anchor; neither reaches the listener's own serving certificate, so its ``notAfter`` is read here from the DER.
Only the path to it is walked (RFC 5280, section 4.1): Certificate and TBSCertificate are SEQUENCEs; the TBS
starts with an optional ``[0]`` version, then serialNumber, signature and issuer, then validity, a SEQUENCE of
notBefore and notAfter, each a UTCTime or a GeneralizedTime in UTC.
"""

from __future__ import annotations

import re
import ssl
from collections.abc import Sequence
from datetime import UTC, datetime

_SEQUENCE, _VERSION, _UTC_TIME, _GENERALIZED_TIME = 0x30, 0xA0, 0x17, 0x18
_PEM_CERTIFICATE = re.compile(r"-----BEGIN CERTIFICATE-----.*?-----END CERTIFICATE-----", re.DOTALL)


class CertificateError(ValueError):
    """A certificate whose DER does not have the shape RFC 5280 gives it."""


def _element(der: bytes, at: int) -> tuple[int, int, int]:
    """The tag, the first content byte and the end of the DER element at ``at``."""
    if at + 2 > len(der):
        raise CertificateError(f"the certificate ends inside an element header at byte {at}")
    tag, length = der[at], der[at + 1]
    start = at + 2
    if length & 0x80:  # long form: the low bits say how many length bytes follow
        count = length & 0x7F
        if count == 0 or count > 4:
            raise CertificateError(f"the certificate has an element length it cannot hold at byte {at}")
        length = int.from_bytes(der[start:start + count], "big")
        start += count
    if start + length > len(der):
        raise CertificateError(f"an element at byte {at} runs past the certificate's end")
    return tag, start, start + length


def _time(tag: int, text: bytes) -> datetime:
    value = text.decode("ascii", errors="replace")
    if tag == _UTC_TIME and len(value) == 13 and value.endswith("Z"):
        # RFC 5280: two-digit years 50-99 are 19xx, 00-49 are 20xx.
        full = f"{'19' if value[:2] >= '50' else '20'}{value}"
    elif tag == _GENERALIZED_TIME and len(value) == 15 and value.endswith("Z"):
        full = value
    else:
        raise CertificateError(f"the certificate's validity holds {value!r}, not a UTC time as RFC 5280 asks")
    try:
        return datetime.strptime(full, "%Y%m%d%H%M%SZ").replace(tzinfo=UTC)
    except ValueError:
        raise CertificateError(f"the certificate's validity holds {value!r}, not a date") from None


def not_after(der: bytes) -> datetime:
    """The instant after which the DER certificate ``der`` is no longer valid."""
    tag, certificate, _ = _element(der, 0)
    if tag != _SEQUENCE:
        raise CertificateError("the data is not a DER certificate (it does not start with a SEQUENCE)")
    tag, at, _ = _element(der, certificate)
    if tag != _SEQUENCE:
        raise CertificateError("the certificate holds no TBSCertificate SEQUENCE")
    tag, _, end = _element(der, at)
    if tag == _VERSION:
        at = end
    for _field in ("serialNumber", "signature", "issuer"):
        at = _element(der, at)[2]
    tag, validity, _ = _element(der, at)
    if tag != _SEQUENCE:
        raise CertificateError("the certificate holds no validity SEQUENCE where RFC 5280 puts it")
    after = _element(der, validity)[2]
    tag, start, end = _element(der, after)
    return _time(tag, der[start:end])


def pem_certificates(pem: str) -> list[bytes]:
    """The certificates of a PEM text, in DER and in order (a served chain's own certificate first)."""
    certificates = [ssl.PEM_cert_to_DER_cert(block) for block in _PEM_CERTIFICATE.findall(pem)]
    if not certificates:
        raise CertificateError("the file holds no PEM certificate")
    return certificates


def earliest_not_after(certificates: Sequence[bytes]) -> datetime:
    """When the first of a bundle's DER certificates to expire does: a served chain fails verification from then
    on, and so does a client certificate signed by that CA of a bundle."""
    return min(not_after(der) for der in certificates)

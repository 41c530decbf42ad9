"""When a certificate expires, read from its DER, checked against the openssl command's own reading."""

from __future__ import annotations

import contextlib
import shutil
import ssl
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from extender.x509 import CertificateError, earliest_not_after, not_after, pem_certificates
from gpushare.localcluster.pki import Issued, KeyKind, issue, make_ca

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command for certificates")


def openssl_not_after(certificate: Path) -> datetime:
    printed = subprocess.run(["openssl", "x509", "-noout", "-enddate", "-in", str(certificate)], check=True,
                             capture_output=True, text=True).stdout.strip()
    return datetime.fromtimestamp(ssl.cert_time_to_seconds(printed.removeprefix("notAfter=")), UTC)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("x509")


@pytest.fixture(scope="module")
def der(folder: Path) -> bytes:
    return ssl.PEM_cert_to_DER_cert(make_ca(folder, "fuzzed").cert.read_text())


# 9,000 days reach past 2049, where RFC 5280 switches from UTCTime to GeneralizedTime.
@pytest.mark.parametrize("days", [1, 400, 9000])
@pytest.mark.parametrize("key", list(KeyKind))
def test_a_ca_and_a_leaf_expire_when_openssl_says(folder: Path, days: int, key: KeyKind) -> None:
    ca = make_ca(folder, f"ca-{key}-{days}", key, days)
    leaf = issue(ca, folder, f"leaf-{key}-{days}", days, server=True, key=key, days=days)
    for certificate in (ca, leaf):
        assert earliest_not_after(pem_certificates(certificate.cert.read_text())) == openssl_not_after(certificate.cert)


def test_a_version_1_certificate_without_the_version_field_expires_when_openssl_says(folder: Path) -> None:
    ca = make_ca(folder, "v1-ca")
    request, leaf = folder / "v1.csr", folder / "v1.crt"
    subprocess.run(["openssl", "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-keyout", str(folder / "v1.key"), "-out", str(request), "-subj", "/CN=v1"], check=True,
                   capture_output=True)
    subprocess.run(["openssl", "x509", "-req", "-in", str(request), "-CA", str(ca.cert), "-CAkey", str(ca.key),
                    "-set_serial", "7", "-days", "3", "-out", str(leaf)], check=True, capture_output=True)
    text = subprocess.run(["openssl", "x509", "-noout", "-text", "-in", str(leaf)], check=True, capture_output=True,
                          text=True).stdout
    assert "Version: 1 (0x0)" in text  # no [0] version field: the TBS starts with the serial number
    assert earliest_not_after(pem_certificates(leaf.read_text())) == openssl_not_after(leaf)


def test_a_bundle_expires_with_its_first_certificate_to_expire(folder: Path) -> None:
    cas: list[Issued] = [make_ca(folder, f"bundled-{days}", days=days) for days in (30, 2, 400)]
    bundle = "".join(ca.cert.read_text() for ca in cas)
    assert earliest_not_after(pem_certificates(bundle)) == openssl_not_after(cas[1].cert)


def test_a_file_without_a_certificate_is_an_error_that_says_so(folder: Path) -> None:
    key = make_ca(folder, "only-key").key.read_text()
    with pytest.raises(CertificateError, match="holds no PEM certificate"):
        pem_certificates(key)


@given(text=st.text(alphabet="0123456789Zab:+-. ", min_size=13, max_size=13), generalized=st.booleans())
def test_any_validity_text_gives_a_date_or_a_certificate_error(der: bytes, text: str, generalized: bool) -> None:
    """The notAfter field replaced by any short text, as a UTCTime or a GeneralizedTime."""
    after = der.index(b"\x17\x0d", der.index(b"\x17\x0d") + 1)  # the second UTCTime: notAfter (a CA of a day)
    # Thirteen characters keep every length byte right: only the time's tag and content change.
    changed = der[:after] + (b"\x18" if generalized else b"\x17") + b"\x0d" + text.encode() + der[after + 15:]
    with contextlib.suppress(CertificateError):
        assert isinstance(not_after(changed), datetime)


@given(cut=st.integers(min_value=0, max_value=300))
def test_a_truncated_certificate_is_an_error_not_a_crash(der: bytes, cut: int) -> None:
    with pytest.raises(CertificateError):
        not_after(der[:min(cut, len(der) - 1)])


@given(data=st.binary(max_size=200))
def test_any_bytes_give_a_date_or_a_certificate_error(data: bytes) -> None:
    with contextlib.suppress(CertificateError):
        assert isinstance(not_after(data), datetime)

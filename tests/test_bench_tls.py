"""The connection benchmark: each transport's extender answers on kept-alive and on new connections."""

from __future__ import annotations

import pytest

from bench.bench_tls import main


def test_each_transport_named_gets_a_row_of_figures_from_an_extender_that_answered(
        capsys: pytest.CaptureFixture[str]) -> None:
    # measure() raises unless every filter is answered with HTTP 200, so a row means the TLS handshake
    # (the loop's client certificate against the extender's CA) and the filter both worked.
    assert main(["--calls", "3", "--repeats", "1", "--transports", "http,mtls-ecdsa"]) == 0
    out, err = capsys.readouterr()
    rows = {line.split("|")[1].strip(): line for line in out.splitlines() if line.startswith("| ")}
    assert set(rows) == {"transport", "http", "mtls-ecdsa"}
    assert "repeat 1 of 1: mtls-ecdsa" in err


def test_no_calls_is_refused_with_what_is_allowed(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--calls", "0"])
    assert "--calls and --repeats must be at least 1, not 0 and 3." in capsys.readouterr().err

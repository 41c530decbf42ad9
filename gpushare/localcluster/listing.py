"""List and watch options as the API server reads them: which version to serve, paging, and their checks.

- ``resourceVersion`` unset: the latest state. ``"0"``: any state (the latest here); ``limit`` is then ignored,
  as the watch cache serves such lists whole. ``N`` with ``resourceVersionMatch`` unset or ``NotOlderThan``:
  a state at least as new as N; ``Exact``: the state at exactly N, which must still be in the kind's history
  (else 410 ``Expired``). A version the store has not reached yet is waited for up to 3 s, then answered with
  504 ``Timeout`` and a ``ResourceVersionTooLarge`` cause, as the watch cache does.
- ``limit`` and ``continue``: pages of one consistent snapshot, the version of the first page. The token is
  the one etcd-backed storage uses (base64 of ``{"v": "meta.k8s.io/v1", "rv": N, "start": "<key>\\x00"}``);
  once N has left the history, a continue answers 410 ``Expired`` with a token (``rv`` -1) that resumes the
  remainder at the latest version instead.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import Any

import orjson

from gpushare.localcluster.errors import ApiError, bad_request, expired
from gpushare.localcluster.validation import FieldError, forbidden, invalid_object, not_supported

TOKEN_VERSION = "meta.k8s.io/v1"
EXACT = "Exact"
NOT_OLDER_THAN = "NotOlderThan"
INCONSISTENT_CONTINUE = (
    "The provided continue parameter is too old to display a consistent list result. You can start a new list "
    "without the continue parameter, or use the continue token in this response to retrieve the remainder of the "
    "results. Continuing with the provided token results in an inconsistent list - objects that were created, "
    "modified, or deleted between the time the first chunk was returned and now may show up in the list.")
# How long a read waits for a resource version the store has not reached (the watch cache's blockTimeout).
TOO_LARGE_WAIT_S = 3.0


@dataclass(frozen=True)
class ListRequest:
    """What a list asks for. ``version`` None means the latest; ``at_least`` is a version to wait for first."""

    version: int | None
    at_least: int
    limit: int
    start: str  # storage key to start at, from a continue token


def encode_continue(version: int, start: str) -> str:
    token = {"v": TOKEN_VERSION, "rv": version, "start": start}
    return base64.urlsafe_b64encode(orjson.dumps(token)).decode().rstrip("=")


def _decode_continue(token: str) -> tuple[int, str]:
    try:
        data: Any = orjson.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
    except (binascii.Error, ValueError):
        raise bad_request("invalid continue token: continue key is not valid: the token is not base64-encoded "
                          "JSON; use the token from the previous page as it was returned") from None
    if not isinstance(data, dict) or data.get("v") != TOKEN_VERSION:
        raise bad_request(f"invalid continue token: continue key is not valid: server does not recognize this "
                          f"encoded version (expected {TOKEN_VERSION})")
    version, start = data.get("rv"), data.get("start")
    if not isinstance(version, int) or isinstance(version, bool) or version == 0 or version < -1:
        raise bad_request(f"invalid continue token: continue key is not valid: incorrect encoded start "
                          f"resourceVersion (version {TOKEN_VERSION})")
    if not isinstance(start, str) or not start:
        raise bad_request("invalid continue token: continue key is not valid: encoded start key is not valid")
    return version, start


def _options_invalid(errors: list[FieldError]) -> ApiError:
    return invalid_object("ListOptions", "meta.k8s.io", "", errors)


def _version(text: str) -> int:
    # Versions are unsigned 64-bit integers, as etcd revisions are parsed.
    value = int(text) if text.isdigit() and len(text) <= 20 else -1
    if not 0 <= value < 2**64:
        raise bad_request(f'resourceVersion "{text}" is not a resource version; use one returned by a list, a get '
                          "or a watch event")
    return value


def _limit(text: str) -> int:
    try:
        return int(text) if text else 0
    except ValueError:
        raise bad_request(f'limit "{text}" is not a whole number of items') from None


def list_request(query: dict[str, str], retained: int) -> ListRequest:
    """Read and check a list's options. ``retained`` is the oldest version the kind's history can rebuild."""
    version_text = query.get("resourceVersion", "")
    match = query.get("resourceVersionMatch", "")
    token = query.get("continue", "")
    errors: list[FieldError] = []
    if match:
        if not version_text:
            errors.append(forbidden("resourceVersionMatch",
                                    "resourceVersionMatch is forbidden unless resourceVersion is provided"))
        if token:
            errors.append(forbidden("resourceVersionMatch", "resourceVersionMatch is forbidden when continue is "
                                    "provided"))
        if match not in (EXACT, NOT_OLDER_THAN):
            errors.append(not_supported("resourceVersionMatch", match, (EXACT, NOT_OLDER_THAN, "")))
        if match == EXACT and version_text == "0":
            errors.append(forbidden("resourceVersionMatch",
                                    'resourceVersionMatch "exact" is forbidden for resourceVersion "0"'))
    if "sendInitialEvents" in query:
        errors.append(forbidden("sendInitialEvents", "sendInitialEvents is forbidden for list"))
    if errors:
        raise _options_invalid(errors)
    limit = _limit(query.get("limit", ""))
    if token:
        if version_text not in ("", "0"):
            raise bad_request("specifying resource version is not allowed when using continue")
        version, start = _decode_continue(token)
        if version == -1:
            return ListRequest(None, 0, limit, start)
        if version < retained:
            raise expired(INCONSISTENT_CONTINUE, {"continue": encode_continue(-1, start)})
        return ListRequest(version, 0, limit, start)
    if version_text == "":
        return ListRequest(None, 0, limit, "")
    if version_text == "0":
        return ListRequest(None, 0, 0, "")
    wanted = _version(version_text)
    if match == EXACT:
        return ListRequest(wanted, wanted, limit, "")
    return ListRequest(None, wanted, limit, "")


def version_floor(query: dict[str, str]) -> int:
    """The version a list must wait for before it is served (0 for none), read leniently: the checks come after."""
    text = query.get("resourceVersion", "")
    return int(text) if text.isdigit() and len(text) <= 20 and not query.get("continue") else 0


@dataclass(frozen=True)
class WatchRequest:
    """What a watch asks for: where to start, and whether (and how) to send the current state first."""

    version: str
    initial_events: bool | None  # None: the legacy rule (initial events for version "" or "0")
    at_least: int


def watch_request(query: dict[str, str]) -> WatchRequest:
    match = query.get("resourceVersionMatch", "")
    initial = query.get("sendInitialEvents")
    errors: list[FieldError] = []
    if initial is not None and match != NOT_OLDER_THAN:
        errors.append(forbidden("resourceVersionMatch",
                                f"sendInitialEvents requires setting resourceVersionMatch to {NOT_OLDER_THAN}"))
    if match:
        if initial is None:
            errors.append(forbidden("resourceVersionMatch",
                                    "resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided"))
        if match != NOT_OLDER_THAN:
            errors.append(not_supported("resourceVersionMatch", match, (NOT_OLDER_THAN,)))
        if query.get("continue"):
            errors.append(forbidden("resourceVersionMatch", "resourceVersionMatch is forbidden when continue is "
                                    "provided"))
    if errors:
        raise _options_invalid(errors)
    version = query.get("resourceVersion", "")
    wanted = _version(version) if version not in ("", "0") else 0
    if initial is None:
        return WatchRequest(version, None, 0)
    send = initial.lower() in ("true", "1")
    # With the initial events, the version is a floor for the state they show; without, where changes start.
    return WatchRequest(version, send, wanted if send else 0)

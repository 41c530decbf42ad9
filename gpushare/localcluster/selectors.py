"""Label and field selectors, parsed from the ``labelSelector`` and ``fieldSelector`` query parameters.

Labels: ``k=v``, ``k==v``, ``k!=v``, ``k in (a,b)``, ``k notin (a,b)``, ``k`` (exists), ``!k`` (does not exist).
Fields: ``f=v``, ``f==v``, ``f!=v``, on the fields each resource supports; a missing field reads as ``""``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection
from dataclasses import dataclass

from gpushare.localcluster.errors import ApiError, bad_request

Getter = Callable[[str], str | None]

_KEY = r"[A-Za-z0-9](?:[-A-Za-z0-9_./]*[A-Za-z0-9])?"
_VALUE = re.compile(r"(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?)?")
_SET_RE = re.compile(rf"\s*(?P<key>{_KEY})\s+(?P<op>in|notin)\s*\((?P<values>[^()]*)\)\s*")
_EQ_RE = re.compile(rf"\s*(?P<key>{_KEY})\s*(?P<op>==|!=|=)\s*(?P<value>\S*)\s*")
_EXISTS_RE = re.compile(rf"\s*(?P<neg>!?)\s*(?P<key>{_KEY})\s*")


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # "=", "!=", "in", "notin", "exists", "!exists"
    values: frozenset[str] = frozenset()

    def matches(self, value: str | None) -> bool:
        if self.op in ("=", "in"):
            return value is not None and value in self.values
        if self.op in ("!=", "notin"):
            return value is None or value not in self.values
        if self.op == "exists":
            return value is not None
        return value is None


@dataclass(frozen=True)
class Selector:
    requirements: tuple[Requirement, ...] = ()

    def matches(self, get: Getter) -> bool:
        return all(r.matches(get(r.key)) for r in self.requirements)

    def equals(self, key: str) -> str | None:
        """The value ``key`` must equal for a match, if the selector pins it to exactly one."""
        for r in self.requirements:
            if r.key == key and r.op in ("=", "in") and len(r.values) == 1:
                return next(iter(r.values))
        return None

    def __bool__(self) -> bool:
        return bool(self.requirements)


def _split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside ``( )``."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p for p in parts if p.strip()]


def _label_error(text: str, part: str) -> ApiError:
    return bad_request(f'unable to parse requirement: the label selector "{text}" has an invalid part '
                       f'"{part.strip()}"; use key=value, key!=value, key in (a,b), key notin (a,b), key or !key')


def parse_label_selector(text: str | None) -> Selector:
    if not text or not text.strip():
        return Selector()
    requirements = []
    for part in _split_top_level(text):
        if found := _SET_RE.fullmatch(part):
            values = [v.strip() for v in found["values"].split(",") if v.strip()]
            if not values or not all(_VALUE.fullmatch(v) for v in values):
                raise _label_error(text, part)
            requirements.append(Requirement(found["key"], found["op"], frozenset(values)))
        elif found := _EQ_RE.fullmatch(part):
            if not _VALUE.fullmatch(found["value"]):
                raise _label_error(text, part)
            op = "!=" if found["op"] == "!=" else "="
            requirements.append(Requirement(found["key"], op, frozenset([found["value"]])))
        elif found := _EXISTS_RE.fullmatch(part):
            requirements.append(Requirement(found["key"], "!exists" if found["neg"] else "exists"))
        else:
            raise _label_error(text, part)
    return Selector(tuple(requirements))


def _unescape_field_parts(text: str) -> list[str]:
    """Split a field selector on unescaped commas; ``\\,``, ``\\=`` and ``\\\\`` stand for themselves."""
    parts, current, escaped = [], [], False
    for char in text:
        if escaped:
            current.append("\\" + char)
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == ",":
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    if escaped:
        current.append("\\")
    parts.append("".join(current))
    return [p for p in parts if p.strip()]


def _unescape(text: str) -> str:
    return re.sub(r"\\(.)", r"\1", text)


def parse_field_selector(text: str | None, supported: Collection[str]) -> Selector:
    if not text or not text.strip():
        return Selector()
    requirements = []
    for part in _unescape_field_parts(text):
        found = re.fullmatch(r"\s*([^=!\s]+)\s*(==|!=|=)(.*)", part)
        if not found:
            raise bad_request(f'invalid field selector "{text}": "{part}" is not of the form field=value, '
                              "field==value or field!=value")
        key, op, value = found.group(1), found.group(2), _unescape(found.group(3).strip())
        if key not in supported:
            raise bad_request(f'field label not supported: {key} (supported here: {", ".join(sorted(supported))})')
        requirements.append(Requirement(key, "!=" if op == "!=" else "=", frozenset([value])))
    return Selector(tuple(requirements))

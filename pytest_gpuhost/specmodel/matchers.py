"""Compare a raw observed string with what the spec expects.

Values stay the strings that were read; a *domain* says how two of them compare (integers as
integers, link speeds by their GT/s number, text whitespace-normalized) and an *expectation*
(exact, range, one_of, match) says which observed values pass and which value a fix writes.
"""

from __future__ import annotations

import math
import re
from typing import Protocol

import msgspec


class Domain(Protocol):
    """How raw strings of one kind of value are validated, ordered and compared."""

    name: str

    def validate(self, value: str) -> None:
        """Raise ValueError (with a reason) when a spec value is not of this domain."""

    def order_key(self, raw: str) -> float | int:
        """A number to order by; raise ValueError when ``raw`` has none."""

    def equal(self, observed: str, expected: str) -> bool: ...


def normalize_ws(raw: str) -> str:
    """Collapse runs of whitespace: ``"4096\\t87380  16777216\\n"`` -> ``"4096 87380 16777216"``."""
    return " ".join(raw.split())


_INT = re.compile(r"[+-]?\d+\Z")


def parse_int(raw: str) -> int:
    """Parse a decimal integer exactly: never truncates ``"1.5"`` or ``"1 2"`` to a number."""
    text = raw.strip()
    if not _INT.match(text):
        raise ValueError(f"not an integer: {raw.strip()!r}")
    return int(text)


def finite(text: str, what: str) -> float:
    """``text`` as a finite number; ValueError naming ``what`` for anything else: NaN passes
    every comparison written as ``not observed < floor``, and an infinity (``inf``, ``1e999``,
    400 digits) is a bound that means nothing."""
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"not {what}: {text.strip()[:40]!r}") from None
    if not math.isfinite(value):
        raise ValueError(f"not {what}: {text.strip()[:40]!r} is not a finite number")
    return value


class Auto:
    """sysctl values: integers compare as integers, anything else as normalized text."""

    name = "auto"

    def validate(self, value: str) -> None:
        if not normalize_ws(value):
            raise ValueError("an empty value")

    def order_key(self, raw: str) -> float | int:
        """An integer here; a subclass may order by a float (Watts)."""
        return parse_int(raw)

    def equal(self, observed: str, expected: str) -> bool:
        try:
            return parse_int(observed) == parse_int(expected)
        except ValueError:
            return normalize_ws(observed) == normalize_ws(expected)


class Integer(Auto):
    """Integers only, optionally from a fixed set (MaxReadReq accepts 128 << 0..5)."""

    name = "integer"

    def __init__(self, allowed: tuple[int, ...] | None = None) -> None:
        self.allowed = allowed

    def validate(self, value: str) -> None:
        number = parse_int(value)
        if self.allowed is not None and number not in self.allowed:
            choices = ", ".join(str(a) for a in self.allowed)
            raise ValueError(f"{number} is not one of {choices}")

    def equal(self, observed: str, expected: str) -> bool:
        try:
            return parse_int(observed) == parse_int(expected)
        except ValueError:
            return False


_SPEED = re.compile(r"\s*(\d+(?:\.\d+)?)\s*GT/s\b")


class LinkSpeed:
    """PCIe speeds: sysfs says ``32.0 GT/s PCIe`` (older kernels ``8 GT/s``); compare the number."""

    name = "link speed"

    def validate(self, value: str) -> None:
        self.order_key(value)

    def order_key(self, raw: str) -> float:
        match = _SPEED.match(raw)
        if not match:
            raise ValueError(f"not a link speed like '32.0 GT/s': {raw.strip()!r}")
        return finite(match.group(1), "a link speed like '32.0 GT/s'")

    def equal(self, observed: str, expected: str) -> bool:
        try:
            return self.order_key(observed) == self.order_key(expected)
        except ValueError:
            return False


_VERSION = re.compile(r"\d+(?:\.\d+){0,3}\Z")
_VERSION_PART_LIMIT = 100_000


class Version:
    """Dotted release numbers compared part by part: ``580.95.05`` >= ``580.0``, ``580.105`` >
    ``580.95`` (never as text or as a float), trailing zeros ignored (``580`` == ``580.0``)."""

    name = "version"

    def parts(self, raw: str) -> tuple[int, ...]:
        text = raw.strip()
        if not _VERSION.match(text):
            raise ValueError(f"not a version like '580.95.05': {text!r}")
        parts = tuple(int(p) for p in text.split("."))
        if any(p >= _VERSION_PART_LIMIT for p in parts):
            raise ValueError(f"version part too large in {text!r}")
        return parts

    def validate(self, value: str) -> None:
        self.parts(value)

    def order_key(self, raw: str) -> int:
        """Four parts of up to five digits each, packed into one integer that orders like the
        tuple (580.95.05 -> 580_00095_00005_00000)."""
        parts = (*self.parts(raw), 0, 0, 0)[:4]
        key = 0
        for part in parts:
            key = key * _VERSION_PART_LIMIT + part
        return key

    def equal(self, observed: str, expected: str) -> bool:
        try:
            return self.order_key(observed) == self.order_key(expected)
        except ValueError:
            return False


class Choice:
    """A word from a fixed vocabulary (module states: loaded, absent)."""

    name = "choice"

    def __init__(self, words: tuple[str, ...]) -> None:
        self.words = words

    def validate(self, value: str) -> None:
        if value not in self.words:
            raise ValueError(f"{value!r} is not one of {', '.join(self.words)}")

    def order_key(self, raw: str) -> int:
        raise ValueError(f"{self.words} have no order")

    def equal(self, observed: str, expected: str) -> bool:
        return observed.strip() == expected


class Verdict(msgspec.Struct, frozen=True):
    ok: bool
    reason: str = ""
    warning: str = ""
    """For a pass that is close to failing (a bandwidth just above its floor): shown in the
    summary and the report, the outcome stays passed."""


class Expectation(Protocol):
    def describe(self) -> str:
        """What is expected, as a reader would write it: ``0``, ``>= 16777216``."""

    def judge(self, observed: str | None) -> Verdict: ...

    def fix_value(self, observed: str | None) -> str | None:
        """The value a fix writes, or None when the expectation names no single value."""


def _missing() -> Verdict:
    return Verdict(False, "nothing was observed")


class Exact(msgspec.Struct, frozen=True):
    value: str
    domain: Domain

    def describe(self) -> str:
        return normalize_ws(self.value)

    def judge(self, observed: str | None) -> Verdict:
        if observed is None:
            return _missing()
        if self.domain.equal(observed, self.value):
            return Verdict(True)
        return Verdict(False, f"{normalize_ws(observed)!r} != {self.describe()!r}")

    def fix_value(self, observed: str | None) -> str | None:
        return self.value


class Range(msgspec.Struct, frozen=True):
    """``{min: X}``, ``{max: X}`` or both; a fix writes the bound that was crossed."""

    min: str | None
    max: str | None
    domain: Domain

    def describe(self) -> str:
        parts = []
        if self.min is not None:
            parts.append(f">= {self.min}")
        if self.max is not None:
            parts.append(f"<= {self.max}")
        return " and ".join(parts)

    def _position(self, observed: str) -> int:
        """-1 below min, 1 above max, 0 inside; ValueError when observed has no order."""
        key = self.domain.order_key(observed)
        if self.min is not None and key < self.domain.order_key(self.min):
            return -1
        if self.max is not None and key > self.domain.order_key(self.max):
            return 1
        return 0

    def judge(self, observed: str | None) -> Verdict:
        if observed is None:
            return _missing()
        try:
            position = self._position(observed)
        except ValueError as exc:
            return Verdict(False, str(exc))
        if position < 0:
            return Verdict(False, f"{normalize_ws(observed)} < min {self.min}")
        if position > 0:
            return Verdict(False, f"{normalize_ws(observed)} > max {self.max}")
        return Verdict(True)

    def fix_value(self, observed: str | None) -> str | None:
        """None when the observed value has no order (``4096 87380 6291456`` under a min):
        writing the bound there would replace a multi-value setting with one number."""
        try:
            above = observed is not None and self._position(observed) > 0
        except ValueError:
            return None
        if above or self.min is None:
            return self.max
        return self.min


class OneOf(msgspec.Struct, frozen=True):
    values: tuple[str, ...]
    domain: Domain

    def describe(self) -> str:
        return "one of " + ", ".join(normalize_ws(v) for v in self.values)

    def judge(self, observed: str | None) -> Verdict:
        if observed is None:
            return _missing()
        if any(self.domain.equal(observed, v) for v in self.values):
            return Verdict(True)
        return Verdict(False, f"{normalize_ws(observed)!r} is not {self.describe()}")

    def fix_value(self, observed: str | None) -> str | None:
        return self.values[0]


class Match(msgspec.Struct, frozen=True):
    """A regular expression that must match the whole whitespace-normalized value."""

    pattern: re.Pattern[str]

    def describe(self) -> str:
        return f"matches /{self.pattern.pattern}/"

    def judge(self, observed: str | None) -> Verdict:
        if observed is None:
            return _missing()
        if self.pattern.fullmatch(normalize_ws(observed)):
            return Verdict(True)
        return Verdict(False, f"{normalize_ws(observed)!r} does not match /{self.pattern.pattern}/")

    def fix_value(self, observed: str | None) -> str | None:
        return None


def parse_rate(raw: str) -> float:
    """A bandwidth in GB/s as a probe wrote it (``26.34``); ValueError for anything else."""
    text = raw.strip()
    value = finite(text, "a bandwidth in GB/s")
    if value < 0:
        raise ValueError(f"not a bandwidth in GB/s: {text!r}")
    return value


class Floor(msgspec.Struct, frozen=True):
    """A measured bandwidth must reach ``floor`` GB/s; within ``warn_margin`` (a fraction) above
    it the check passes with a warning. A measurement is never "fixed"."""

    floor: float
    label: str
    """What the floor applies to (``same_numa``), shown with the number."""
    warn_margin: float = 0.0

    def describe(self) -> str:
        return f">= {self.floor:g} GB/s ({self.label})"

    def judge(self, observed: str | None) -> Verdict:
        if observed is None:
            return _missing()
        try:
            value = parse_rate(observed)
        except ValueError as exc:
            return Verdict(False, str(exc))
        if value < self.floor:
            return Verdict(False, f"{value:.2f} GB/s < floor {self.floor:g} GB/s ({self.label}), "
                                  f"{value / self.floor:.0%} of the floor")
        if value < self.floor * (1 + self.warn_margin):
            return Verdict(True, warning=f"{value:.2f} GB/s is within {self.warn_margin:.0%} "
                                         f"above the floor {self.floor:g} GB/s ({self.label})")
        return Verdict(True)

    def fix_value(self, observed: str | None) -> str | None:
        return None

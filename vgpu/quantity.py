"""Kubernetes resource quantities ("10", "2k", "4Gi", "500m", "1e3") parsed exactly.

Used by the request parser; a quantity that is not well formed raises ValueError with the reason.
"""

import re
from fractions import Fraction
from functools import lru_cache

__all__ = ["parse_integer_quantity", "parse_quantity"]

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 10**3),
    "": Fraction(1),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
}
_PATTERN = re.compile(
    r"^(?P<sign>[+-]?)(?P<num>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
    r"(?:(?P<bin>Ki|Mi|Gi|Ti|Pi|Ei)|[eE](?P<exp>[+-]?[0-9]+)|(?P<dec>[numkMGTPE]?))$"
)
_MAX_LEN = 64


def parse_quantity(value: object) -> Fraction:
    """Return the exact value of a Kubernetes quantity (str, int) or raise ValueError."""
    if isinstance(value, bool):
        raise ValueError(f"not a quantity: {value!r}")
    if isinstance(value, int):
        return Fraction(value)
    if not isinstance(value, str):
        raise ValueError(f"not a quantity: {value!r}")
    return _parse_text(value)


@lru_cache(maxsize=4096)  # pods repeat a few quantities ("4", "8Gi"); a Fraction is immutable, so one may be shared
def _parse_text(value: str) -> Fraction:
    text = value.strip()
    if not text or len(text) > _MAX_LEN:
        raise ValueError(f"not a quantity: {value!r}")
    match = _PATTERN.match(text)
    if match is None:
        raise ValueError(f"not a quantity: {value!r}")
    number = Fraction(match["num"])
    if match["sign"] == "-":
        number = -number
    if match["bin"]:
        return number * _BINARY[match["bin"]]
    if match["exp"] is not None:
        exponent = int(match["exp"])
        if abs(exponent) > 30:
            raise ValueError(f"exponent out of range: {value!r}")
        return number * Fraction(10) ** exponent
    return number * _DECIMAL[match["dec"] or ""]


def parse_integer_quantity(value: object) -> int:
    """Return a quantity that must be a whole number, or raise ValueError."""
    exact = parse_quantity(value)
    if exact.denominator != 1:
        raise ValueError(f"not a whole number: {value!r}")
    return int(exact)

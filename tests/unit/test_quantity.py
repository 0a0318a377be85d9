"""Kubernetes quantity parsing."""

from fractions import Fraction

import pytest

from vgpu.quantity import parse_integer_quantity, parse_quantity


@pytest.mark.parametrize(
    "text, value",
    [
        ("10", 10),
        (7, 7),
        ("2k", 2000),
        ("1Ki", 1024),
        ("4Gi", 4 * 2**30),
        ("1e3", 1000),
        ("1E3", 1000),
        ("+5", 5),
        ("-3", -3),
        ("500m", Fraction(1, 2)),
        ("1.5", Fraction(3, 2)),
        (".5k", 500),
        (" 12 ", 12),
    ],
)
def test_parse(text, value):
    assert parse_quantity(text) == value


@pytest.mark.parametrize("text", ["", "abc", "1.2.3", "1KiB", "Gi", "1 Gi", "1e999", True, None, 1.5, "9" * 80])
def test_reject(text):
    with pytest.raises(ValueError):
        parse_quantity(text)


def test_integer_quantity_rejects_fractions():
    assert parse_integer_quantity("1.0") == 1
    with pytest.raises(ValueError, match="whole"):
        parse_integer_quantity("500m")

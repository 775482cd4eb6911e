"""Exact clocks: the decimal text of a trace's ``ts``/``dur`` (microseconds) to integer nanoseconds.

A Kineto trace writes microseconds with three decimals; at Unix-epoch scale (``1.76e15`` us) a float64
holds only about 0.25 us of resolution, so ``rint(ts * 1000.0)`` rounds to 256 ns and union-based
breakdowns drift. Here the number's text is read digit by digit into an int64, exactly, whatever its
magnitude (up to ``9.2e15`` us, year 2262 on the Unix clock) and however many decimals it has: more than
three decimals (picoseconds) round half to even to the nanosecond; an exponent (``1.5e3``) is exact too.

:func:`ns_column` parses a whole column at once from the values' texts joined by commas (numpy, no
Python per value); the rare value it cannot take (an exponent, more than three decimals, a quoted
number, an int64 overflow) goes through :func:`us_text_to_ns` (``decimal``, exact).
"""

from __future__ import annotations

import re
import warnings
from decimal import ROUND_HALF_EVEN, Decimal, InvalidOperation
from typing import cast

import numpy as np

_COMMA, _DOT, _MINUS, _ZERO, _NINE = 44, 46, 45, 48, 57
# Powers of ten that fit an int64; a digit weighted beyond 10**18 would overflow.
_POW10 = np.array([10**k for k in range(19)], dtype=np.int64)
# 16 integer digits of microseconds are at most 9.99e18 ns: past int64 from 9.22e18, so the widest
# integer part the vectorized path takes is 15 digits plus a 16th below 9.
_MAX_INT_DIGITS = 16


class ClockValueError(ValueError):
    """A ``ts``/``dur`` value that is not a number of microseconds."""


def us_text_to_ns(text: str | bytes) -> int:
    """One JSON number (or quoted number) in microseconds to integer nanoseconds, exactly (round half
    to even below the nanosecond)."""
    if isinstance(text, bytes | bytearray | memoryview):
        text = bytes(text).decode("ascii", "replace")
    body = text.strip().strip('"')
    try:
        value = Decimal(body) * 1000
    except InvalidOperation:
        raise ClockValueError(f"not a number of microseconds: {text!r}") from None
    if not value.is_finite():
        raise ClockValueError(f"not a finite number of microseconds: {text!r}")
    ns = int(value.to_integral_value(ROUND_HALF_EVEN))
    if not -(2**63) <= ns < 2**63:
        raise ClockValueError(f"{text!r} us does not fit int64 nanoseconds")
    return ns


def ns_to_us_text(ns: int) -> str:
    """Integer nanoseconds as the exact decimal text of microseconds (three decimals): what a trace writes,
    readable back to the same nanosecond at any magnitude (a float would round at Unix-epoch clocks)."""
    ns = int(ns)
    sign, ns = ("-", -ns) if ns < 0 else ("", ns)
    return f"{sign}{ns // 1000}.{ns % 1000:03d}"


def value_to_ns(value: object) -> int:
    """A decoded ``ts``/``dur``: an int (whole microseconds), a decimal text, or a float (exact only
    where the float is; used for hand-built events)."""
    if isinstance(value, bool):
        raise ClockValueError(f"not a number of microseconds: {value!r}")
    if isinstance(value, int):
        return value * 1000
    if isinstance(value, float):
        return us_text_to_ns(repr(value))
    if isinstance(value, str | bytes):
        return us_text_to_ns(value)
    raise ClockValueError(f"not a number of microseconds: {value!r}")


_PLAIN = re.compile(rb"[^0-9.,-]")


def ns_column(joined: bytes, n: int) -> np.ndarray:
    """``n`` JSON numbers in microseconds, their texts joined by commas, to int64 nanoseconds."""
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    if not joined:
        raise ClockValueError("an empty time value")
    if _PLAIN.search(joined) is None:
        out = _split_at_dot(joined, n)
        if out is not None:
            return out
    return _by_character(joined, n)


def _split_at_dot(joined: bytes, n: int) -> np.ndarray | None:
    """The usual texts (digits, at most one dot, a leading minus): the integer part and the decimals are
    read as two integers by numpy's number scanner, exact while each is below 2**53; None when a value
    falls outside that (the caller then reads character by character)."""
    b = np.frombuffer(joined, dtype=np.uint8)
    sep = np.flatnonzero(b == _COMMA)
    dots = np.flatnonzero(b == _DOT)
    if len(sep) != n - 1:
        return None
    value_of_dot = np.searchsorted(sep, dots)
    has_dot = np.bincount(value_of_dot, minlength=n)
    if len(dots) and has_dot.max() > 1:
        return None
    text = joined.replace(b".", b",")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        try:
            numbers = np.fromstring(text, dtype=np.float64, sep=",")  # noqa: NPY201 - text mode is kept
        except (ValueError, DeprecationWarning):
            return None
    if len(numbers) != n + len(dots) or np.any(np.abs(numbers) >= 2.0**53):
        return None
    first = np.arange(n) + np.concatenate([[0], np.cumsum(has_dot)[:-1]])
    starts = np.concatenate([[0], sep + 1])
    negative = b[starts] == _MINUS
    whole = np.abs(numbers[first]).astype(np.int64) * 1000
    if len(dots):
        ends = np.concatenate([sep, [len(b)]])
        with_dot = np.flatnonzero(has_dot)
        n_dec = ends[with_dot] - dots - 1
        if np.any(n_dec > 3) or np.any(n_dec < 1) or np.any(dots == starts[with_dot] + negative[with_dot]):
            return None
        frac = numbers[first[with_dot] + 1].astype(np.int64)
        whole[with_dot] += frac * _POW10[3 - n_dec]
    return cast(np.ndarray, np.where(negative, -whole, whole))


def _by_character(joined: bytes, n: int) -> np.ndarray:
    b = np.frombuffer(joined, dtype=np.uint8)
    sep = np.flatnonzero(b == _COMMA)
    if len(sep) != n - 1:
        raise ClockValueError(f"expected {n} values, found {len(sep) + 1} (a value holds a comma?)")
    starts = np.empty(n, dtype=np.int64)
    starts[0] = 0
    starts[1:] = sep + 1
    ends = np.empty(n, dtype=np.int64)
    ends[:-1] = sep
    ends[-1] = len(b)
    tok = np.zeros(len(b), dtype=np.int64)  # the value each character belongs to
    tok[sep] = 1
    np.cumsum(tok, out=tok)

    is_digit = (b >= _ZERO) & (b <= _NINE)
    is_dot = b == _DOT
    negative = b[np.minimum(starts, len(b) - 1)] == _MINUS
    negative &= ends > starts
    # anything but digits, one dot and a leading minus sends the value to the exact scalar path
    other = ~(is_digit | is_dot) & (b != _COMMA)
    other[starts[negative]] = False
    slow = np.bincount(tok[other], minlength=n) > 0
    slow |= np.bincount(tok[is_dot], minlength=n) > 1
    slow |= ends <= starts + negative  # an empty value

    dot_at = ends.copy()  # no dot: the number ends where the text does
    dots = np.flatnonzero(is_dot)
    dot_at[tok[dots]] = dots
    int_digits = dot_at - starts - negative
    slow |= int_digits > _MAX_INT_DIGITS
    frac_digits = np.where(dot_at < ends, ends - dot_at - 1, 0)
    slow |= frac_digits > 3
    wide = int_digits == _MAX_INT_DIGITS
    slow[wide] |= b[starts[wide] + negative[wide]] >= _NINE

    pos = np.flatnonzero(is_digit)
    d = dot_at[tok[pos]]
    # weight exponent: the integer digit just left of the dot is 10**3 ns; the first decimal 10**2 ns
    exponent = np.where(pos < d, d - pos + 2, d - pos + 3)
    exponent = np.clip(exponent, 0, 18)
    contrib = np.zeros(len(b), dtype=np.int64)
    contrib[pos] = (b[pos].astype(np.int64) - _ZERO) * _POW10[exponent]
    ns = np.add.reduceat(contrib, np.minimum(starts, len(b) - 1))
    # reduceat gives the value at `start` for an empty token; those are marked slow anyway
    ns = np.where(negative, -ns, ns)
    for i in np.flatnonzero(slow).tolist():
        ns[i] = us_text_to_ns(joined[starts[i]:ends[i]])
    return ns

"""Checks of the values users pass: each returns the value in the engine's type, or raises a ValueError that
names the parameter and what it allows."""

import numbers

import numpy as np

INT64_MAX = 2**63 - 1  # the engine's integers are int64 (a seed is uint64)


def integer(value, name: str, minimum: int, maximum: int = INT64_MAX) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    if value > maximum:
        raise ValueError(f"{name} must be an integer <= {maximum}, got {value!r}")
    return int(value)


def real(value, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a real number, got {value!r}")
    try:
        return float(value)
    except OverflowError:  # an int beyond the float range
        raise ValueError(f"{name} must be a real number within the float range, got {value!r}") from None


def flag(value, name: str) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} must be True or False, got {value!r}")
    return bool(value)

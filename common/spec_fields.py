"""The fields of a spec read from JSON, each of exactly its JSON type.

Specs travel as JSON, are hashed, and are checked by the other party (a device checks the
coordinator's, the coordinator the operator's), so a field is taken only in the type it is
declared with, never converted: a number is a JSON number (an integer or a fraction; not a
boolean, not a string such as ``"0.5"``, not NaN or ±Infinity, which Python's ``json`` reads),
an integer a JSON integer (not ``3.0``), a text a JSON string. Each reader returns the value in
the Python type the spec holds it in, or raises ValueError naming the field (``name``, as the
spec's JSON nests it: ``"calibration.sigma_lo"``) and what it got.
"""

from __future__ import annotations

import math


def json_type(value: object) -> str:
    """What ``value`` is, in JSON's words ("a string", "a boolean", "NaN", ...)."""
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else "an infinity"
    kinds = {str: "a string", int: "an integer", float: "a number", list: "an array",
             dict: "an object", type(None): "null"}
    return kinds.get(type(value), type(value).__name__)


def _refuse(name: str, wanted: str, value: object) -> ValueError:
    shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
    return ValueError(f"{name} must be {wanted}, got {json_type(value)} ({shown})")


def number(value: object, name: str) -> float:
    """A finite JSON number (integer or fraction), as a float."""
    if type(value) not in (int, float):
        raise _refuse(name, "a finite number", value)
    try:
        out = float(value)
    except OverflowError:  # an integer beyond float's range
        raise _refuse(name, "a finite number", value) from None
    if not math.isfinite(out):
        raise _refuse(name, "a finite number", value)
    return out


def optional_number(value: object, name: str) -> float | None:
    """null, or a finite JSON number (:func:`number`)."""
    return None if value is None else number(value, name)


def integer(value: object, name: str) -> int:
    """A JSON integer (not a boolean, not a fraction such as 3.0)."""
    if type(value) is not int:
        raise _refuse(name, "an integer", value)
    return value


def text(value: object, name: str) -> str:
    """A JSON string."""
    if type(value) is not str:
        raise _refuse(name, "a string", value)
    return value


def numbers(values: object, name: str) -> tuple[float, ...]:
    """A JSON array of finite numbers, as a tuple of floats (item i named ``name[i]``)."""
    if type(values) is not list:
        raise _refuse(name, "an array of numbers", values)
    return tuple(number(v, f"{name}[{i}]") for i, v in enumerate(values))


def checked(data: dict, readers: dict, where: str = "") -> dict:
    """``data`` with each field that ``readers`` names (field → one of the readers above) read
    by its reader, named ``where.field`` (or ``field``); other fields, and missing ones, are
    left for the spec's constructor to judge."""
    prefix = f"{where}." if where else ""
    return {key: readers[key](value, prefix + key) if key in readers else value
            for key, value in data.items()}

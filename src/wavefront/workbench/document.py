"""The one document protocol and its encoder.

Every job result is a JSON document: its class carries ``SCHEMA = "wavefront.<verb>/<n>"`` and one method,
``as_dict()``, that returns the document (the top level; it may compute or rename fields). Everything under
the top level is plain data: dataclasses, enums, paths, tuples, numpy scalars, which :func:`encode` turns
into JSON values at the edge, so a sub-record needs no serialization method of its own. A sub-record keeps
an ``as_dict()`` only where it computes or renames something (a derived field, a rounded figure); the
encoder uses it when present.

    encode(result)          # -> dicts, lists, str, int, float, bool, None
    dumps(result)           # -> the indented UTF-8 JSON bytes every verb writes (``--json``)
    decode(Record, d)       # -> Record(**the fields of d it knows); the inverse for flat records
    encode_fields(result)   # -> {field: encode(value)}: what a top-level as_dict() spreads beside "schema"
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
from pathlib import Path, PurePath
from typing import Any, TypeVar

T = TypeVar("T")
_PLAIN = (bool, int, str, type(None))  # exactly these types (not subclasses: an IntEnum, torch's version str)


def encode(obj: Any) -> Any:
    """`obj` as JSON values: an object with ``as_dict()`` is its document (encoded in turn), a dataclass is a
    dict of its fields (recursively, in field order), an enum its value, a path its string, a tuple or set a
    list, a numpy scalar or array its Python value(s); a non-finite float is None (JSON has no NaN/inf)."""
    kind = type(obj)
    if kind in _PLAIN:
        return obj
    if kind is float:
        return obj if math.isfinite(obj) else None
    if (names := _record_fields(kind)) is not None:  # a dataclass without its own as_dict(): the common record
        return _fields(obj, names)
    if isinstance(obj, enum.Enum):
        return encode(obj.value)
    if isinstance(obj, float):
        return float(obj) if math.isfinite(obj) else None
    if isinstance(obj, bool | int | str):  # subclasses (torch's version string): the plain value
        return (bool if isinstance(obj, bool) else int if isinstance(obj, int) else str)(obj)
    if isinstance(obj, dict):
        return {k if type(k) is str else _key(k): v if type(v) in _PLAIN else encode(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple | set | frozenset):
        return [encode(v) for v in obj]
    as_dict = getattr(obj, "as_dict", None)
    if callable(as_dict) and not isinstance(obj, type):
        return encode(as_dict())
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return encode_fields(obj)
    if isinstance(obj, PurePath):
        return str(obj)
    if hasattr(obj, "tolist"):  # numpy scalars and arrays, without importing numpy
        return encode(obj.tolist())
    raise TypeError(f"cannot encode {type(obj).__name__} as JSON")


def encode_fields(obj: Any) -> dict[str, Any]:
    """A dataclass instance's fields as JSON values, in field order, without its own ``as_dict()``: what a
    top-level result's document spreads beside its ``"schema"`` (``{"schema": SCHEMA, **encode_fields(self)}``)."""
    return _fields(obj, _field_names(type(obj)))


def _fields(obj: Any, names: tuple[str, ...]) -> dict[str, Any]:
    out = {}
    for name in names:
        value = getattr(obj, name)
        kind = type(value)  # the common cases without a call: thousands of flat records per trace document
        if kind in _PLAIN:
            out[name] = value
        elif kind is float:
            out[name] = value if math.isfinite(value) else None
        else:
            out[name] = encode(value)
    return out


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}
_RECORDS: dict[type, tuple[str, ...] | None] = {}


def _field_names(cls: type) -> tuple[str, ...]:
    if (names := _FIELD_NAMES.get(cls)) is None:
        names = _FIELD_NAMES[cls] = tuple(f.name for f in dataclasses.fields(cls))
    return names


def _record_fields(cls: type) -> tuple[str, ...] | None:
    """The field names of a dataclass type that has no ``as_dict()`` of its own (its document is its fields), else
    None. Cached per type: a trace document encodes thousands of records of one type."""
    if cls not in _RECORDS:
        plain = dataclasses.is_dataclass(cls) and not callable(getattr(cls, "as_dict", None))
        _RECORDS[cls] = _field_names(cls) if plain else None
    return _RECORDS[cls]


def _key(k: Any) -> str:
    if isinstance(k, enum.Enum):
        k = k.value
    return str(k)


def decode(cls: type[T], d: dict[str, Any]) -> T:
    """A flat record (a dataclass whose fields are plain values) from its document: the keys naming its fields,
    others (derived fields its document adds) ignored; missing ones take the field's default."""
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    return cls(**{k: v for k, v in d.items() if k in names})


def dumps(obj: Any) -> bytes:
    """The indented JSON bytes of `obj`'s document (its ``as_dict()``, or `obj`). msgspec's C encoder writes it
    when installed and the document holds only what it encodes natively (the ``trace`` extra: documents of
    thousands of trace steps took seconds in the standard library's pure-Python indenting encoder); otherwise
    the standard library writes :func:`encode`'s output. Both write non-finite floats as null."""
    as_dict = getattr(obj, "as_dict", None)
    doc = as_dict() if callable(as_dict) and not isinstance(obj, type) else obj
    try:
        import msgspec  # lazy: optional msgspec (the trace extra)

        return msgspec.json.format(msgspec.json.encode(doc), indent=2)
    except (ImportError, TypeError):
        return json.dumps(encode(doc), indent=2).encode()


def write_json(obj: Any, path: str | Path) -> None:
    """The document of `obj` to the file `path` (its directory created), newline-terminated."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(dumps(obj) + b"\n")

"""The canonical JSONL schema (version 1): every event kind and its fields, in one place.

:data:`EVENTS` is the single source of truth.  :func:`problems` checks one
event against it (used by ``otel-rollout validate``), and :func:`json_schema`
renders it as the JSON Schema shipped beside this module
(``otel-rollout schema > otel_rollout/schema.json`` regenerates it).

Past 400 lines on purpose: the field types, the table and what is made from
it here (the validator, the JSON Schema, the docs' field reference) change
together and are read together; the typed structs every reader decodes into
are made from the same table in :mod:`otel_rollout.events`.
"""

from __future__ import annotations

import math
import reprlib
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

import msgspec
import orjson

__all__ = [
    "COMMON_FIELDS",
    "EVENTS",
    "SCHEMA_VERSION",
    "EventKind",
    "FieldType",
    "json_schema",
    "json_schema_text",
    "json_type",
    "markdown_reference",
    "problems",
    "shipped_json_schema",
    "struct_type",
]

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class FieldType:
    """A field's type: a name for people, a check for the validator, a JSON Schema for tools."""

    name: str
    check: Callable[[Any], str | None]
    schema: Mapping[str, Any]
    #: The same rule as a msgspec type, so typed readers enforce it in C
    #: (:mod:`otel_rollout.events`); a test checks the two agree on hostile input.
    shape: Any = Any


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    """A finite number a float can hold (an integer past ~1.8e308 cannot)."""
    if _is_int(v):
        try:
            float(v)
        except OverflowError:
            return False
        return True
    return isinstance(v, float) and math.isfinite(v)


def _need(ok: bool, what: str) -> str | None:
    return None if ok else f"must be {what}"


def _calls(v: Any) -> str | None:
    if not isinstance(v, list):
        return "must be a list of [call_id, began_version, tokens]"
    for i, c in enumerate(v):
        if not (isinstance(c, list) and len(c) == 3 and _is_int(c[1]) and _is_int(c[2])):
            return f"item {i} must be [call_id, began_version, tokens]"
        if c[1] < 0 or c[2] < 0:
            return f"item {i} has a negative version or token count"
    return None


def _cuts(v: Any) -> str | None:
    if not isinstance(v, list):
        return "must be a list of [call_id, tokens_so_far]"
    for i, c in enumerate(v):
        if not (isinstance(c, list) and len(c) == 2 and _is_int(c[1]) and c[1] >= 0):
            return f"item {i} must be [call_id, tokens_so_far]"
    return None


def _tokens_by_version(v: Any) -> str | None:
    if not isinstance(v, dict):
        return "must be an object of version → tokens"
    for key, n in v.items():
        if _is_int(key) and key >= 0:  # a dict made in Python: its versions as ints
            pass
        elif not (
            isinstance(key, str)
            and key.isdigit()
            and key.isascii()
            and (key[0] != "0" or key == "0")
        ):
            return f"key {key!r} must be a version as a decimal string (no leading zeros)"
        if not (_is_int(n) and n >= 0):
            return f"tokens for version {key} must be an integer ≥ 0"
    return None


_ID_SCHEMA = {"type": ["string", "integer"]}
_GE0 = Annotated[int, msgspec.Meta(ge=0)]
# Finite: a NaN or an infinity fails these bounds (no JSON line holds one, but a Python
# dict handed to the reference functions can).
_MAX = sys.float_info.max
_FINITE = Annotated[float, msgspec.Meta(ge=-_MAX, le=_MAX)]

INT = FieldType("integer", lambda v: _need(_is_int(v), "an integer"), {"type": "integer"}, int)
COUNT = FieldType(
    "integer ≥ 0",
    lambda v: _need(_is_int(v) and v >= 0, "an integer ≥ 0"),
    {"type": "integer", "minimum": 0},
    _GE0,
)
VERSION = FieldType(
    "version (integer ≥ 0)",
    lambda v: _need(_is_int(v) and v >= 0, "a weight version (an integer ≥ 0)"),
    {"type": "integer", "minimum": 0},
    _GE0,
)
SIZE = FieldType(
    "integer ≥ 1",
    lambda v: _need(_is_int(v) and v >= 1, "an integer ≥ 1"),
    {"type": "integer", "minimum": 1},
    Annotated[int, msgspec.Meta(ge=1)],
)
NUMBER = FieldType(
    "number",
    lambda v: _need(_is_number(v), "a finite number"),
    {"type": "number"},
    _FINITE,
)
SECONDS = FieldType(
    "seconds (number ≥ 0)",
    lambda v: _need(_is_number(v) and v >= 0, "a number of seconds ≥ 0"),
    {"type": "number", "minimum": 0},
    Annotated[float, msgspec.Meta(ge=0, le=_MAX)],
)
OPTIONAL_NUMBER = FieldType(
    "number or null",
    lambda v: _need(v is None or _is_number(v), "a finite number or null"),
    {"type": ["number", "null"]},
    _FINITE | None,
)
STRING = FieldType(
    "string",
    lambda v: _need(isinstance(v, str), "a string"),
    {"type": "string"},
    str,
)
ID = FieldType(
    "string",
    lambda v: _need(isinstance(v, str) and v != "", "a non-empty string"),
    {"type": "string", "minLength": 1},
    Annotated[str, msgspec.Meta(min_length=1)],
)
STRINGS = FieldType(
    "list of strings",
    lambda v: _need(
        isinstance(v, list) and all(isinstance(s, str) for s in v), "a list of strings"
    ),
    {"type": "array", "items": {"type": "string"}},
    list[str],
)
#: A step's groups: the rule that none is named twice is train.step's (``_distinct``), so
#: that typed readers apply it too; JSON Schema says it as ``uniqueItems``.
DISTINCT_STRINGS = FieldType(
    "list of distinct strings",
    STRINGS.check,
    {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
    list[str],
)
OBJECT = FieldType(
    "object",
    lambda v: _need(isinstance(v, dict), "an object"),
    {"type": "object"},
    dict[str, Any],
)
ANY = FieldType(
    "any",
    lambda v: None,
    {},
    msgspec.Raw,
)
SCHEMA_CONST = FieldType(
    f"{SCHEMA_VERSION}",
    lambda v: _need(_is_int(v) and v == SCHEMA_VERSION, f"{SCHEMA_VERSION}"),
    {"const": SCHEMA_VERSION},
    Literal[1],
)
CALLS = FieldType(
    "list of [call_id, began_version, tokens]",
    _calls,
    {
        "type": "array",
        "items": {
            "type": "array",
            "prefixItems": [
                _ID_SCHEMA,
                {"type": "integer", "minimum": 0},
                {"type": "integer", "minimum": 0},
            ],
            "minItems": 3,
            "maxItems": 3,
        },
    },
    list[tuple[Any, _GE0, _GE0]],
)
CUTS = FieldType(
    "list of [call_id, tokens_so_far]",
    _cuts,
    {
        "type": "array",
        "items": {
            "type": "array",
            "prefixItems": [_ID_SCHEMA, {"type": "integer", "minimum": 0}],
            "minItems": 2,
            "maxItems": 2,
        },
    },
    list[tuple[Any, _GE0]],
)
TOKENS_BY_VERSION = FieldType(
    "object: version (decimal string) → tokens",
    _tokens_by_version,
    {
        "type": "object",
        "propertyNames": {"pattern": "^(0|[1-9][0-9]*)$"},
        "additionalProperties": {"type": "integer", "minimum": 0},
    },
    dict[_GE0, _GE0],  # msgspec reads canonical decimal keys as ints, of any size
)


@dataclass(frozen=True)
class EventKind:
    """One event kind: what it means, the fields it must have and the ones it may have."""

    doc: str
    required: Mapping[str, FieldType]
    optional: Mapping[str, FieldType] = field(default_factory=dict)
    #: A rule across fields: called with the values of ``rule_fields`` (None if absent),
    #: it gives the problem, or None.  Readers apply it too.
    rule: Callable[..., str | None] | None = None
    rule_fields: tuple[str, ...] = ()


def _seal_sums(tokens: int, by_version: Mapping[Any, int] | None) -> str | None:
    """A seal's ``tokens`` is the sum of its ``tokens_by_version``, when it has one."""
    if by_version is None:
        return None
    total = sum(by_version.values())
    return (
        None
        if total == tokens
        else f"tokens ({tokens}) is not the sum of tokens_by_version ({total})"
    )


def _distinct(group_ids: list[str]) -> str | None:
    """A step trains each of its groups once (a group named twice would count its tokens
    twice in the step's batch age and the ledger's trained)."""
    if len(set(group_ids)) == len(group_ids):
        return None
    counts = Counter(group_ids)
    twice = [g for g, n in counts.items() if n > 1]
    shown = ", ".join(twice[:5]) + (f" and {len(twice) - 5} more" if len(twice) > 5 else "")
    return f"group_ids names {shown} more than once"


COMMON_FIELDS: Mapping[str, FieldType] = {"t": NUMBER, "run_id": ID, "event": ID}

_GROUP = {"group_id": ID, "prompt_id": INT}
_ATTEMPT = {"attempt_id": ID, "group_id": ID, "prompt_id": INT, "generation_index": COUNT}
_DISPATCH = {**_ATTEMPT, "weight_version": VERSION}

EVENTS: Mapping[str, EventKind] = {
    "run.start": EventKind(
        "Written by the trace itself when it opens.",
        {"schema": SCHEMA_CONST, "pid": INT},
        {"host": STRING, "argv": STRINGS, "config": OBJECT, "parent_run_id": ID},
    ),
    "group.reserve": EventKind(
        "A buffer slot and a prompt are reserved for a group.",
        {**_GROUP, "size": SIZE, "weight_version": VERSION},
        {"epoch": COUNT},
    ),
    "group.admit": EventKind(
        "The group passed admission (capacity, staleness); its attempts may be dispatched.",
        _GROUP,
    ),
    "group.seal": EventKind(
        "The group is published: complete and trainable.",
        {**_GROUP, "tokens": COUNT},
        {"tokens_by_version": TOKENS_BY_VERSION},
        _seal_sums,
        ("tokens", "tokens_by_version"),
    ),
    "group.discard": EventKind(
        "The group is dropped (stale, failed, stop, ...).", {**_GROUP, "reason": ID}
    ),
    "attempt.dispatch": EventKind(
        "One generation of one prompt is sent to the engine.", _DISPATCH, {"epoch": COUNT}
    ),
    "attempt.resume": EventKind(
        "An attempt continues from a rollout snapshot after a restore.",
        {**_DISPATCH, "resumed_tokens": COUNT},
        {"epoch": COUNT, "snapshot": ANY},
    ),
    "attempt.seal": EventKind(
        "The attempt finished and was committed.",
        {**_ATTEMPT, "tokens": COUNT},
        {"calls": CALLS},
    ),
    "attempt.refuse": EventKind(
        "The attempt was refused before it ran (stale, capacity, stopping, ...).",
        {**_ATTEMPT, "reason": ID},
    ),
    "attempt.abandon": EventKind(
        "A running attempt was given up (stop, stale, error, timeout, ...).",
        {**_ATTEMPT, "reason": ID},
        {"tokens": COUNT},
    ),
    "weights.sync": EventKind(
        "A refit installed new weights into the engine; cuts are the running calls it paused.",
        {"replaced_version": VERSION, "new_version": VERSION},
        {"cuts": CUTS, "duration_s": SECONDS},
    ),
    "train.step": EventKind(
        "One optimizer step; trained_version is the policy version the step updates.",
        {"step": COUNT, "trained_version": VERSION, "group_ids": DISTINCT_STRINGS},
        {"batch_age": OPTIONAL_NUMBER, "duration_s": SECONDS},
        _distinct,
        ("group_ids",),
    ),
    "checkpoint.publish": EventKind(
        "A checkpoint became durable.", {"step": COUNT, "weight_version": VERSION}, {"path": STRING}
    ),
    "checkpoint.restore": EventKind(
        "A run restored a checkpoint.",
        {"step": COUNT, "weight_version": VERSION},
        {"path": STRING, "from_run_id": ID},
    ),
    "trace.dropped": EventKind(
        "Written by the trace itself: events it had to drop since the last such line.",
        {"count": COUNT},
    ),
}


def json_type(value: Any) -> str:
    """The JSON name of a decoded value's type (``null``, ``string``, ``array``, …)."""
    names = {type(None): "null", bool: "boolean", int: "number", float: "number",
             str: "string", list: "array", dict: "object"}  # fmt: skip
    return names.get(type(value), type(value).__name__)


def problems(event: Any) -> list[str]:
    """Everything wrong with one event, as sentences; empty when it is valid.

    Unknown fields are fine (readers keep them); an unknown event kind is a
    problem only in the sense that nothing can check it, so it is reported
    with the prefix ``"unknown event kind"`` for callers to treat as a warning.
    """
    if not isinstance(event, dict):
        return [f"is a JSON {json_type(event)}, not an object"]
    found: list[str] = []
    _check_fields(event, COMMON_FIELDS, True, found)
    name = event.get("event")
    kind = EVENTS.get(name) if isinstance(name, str) else None
    if kind is None:
        if isinstance(name, str):
            found.append(f"unknown event kind {name!r}")
        return found
    if not found:
        cut = _written_without_fields(event)
        if cut is not None:  # the writer's own marker: say that, not every missing field
            return [cut]
    _check_fields(event, kind.required, True, found)
    _check_fields(event, kind.optional, False, found)
    if kind.rule is not None and not found:
        problem = kind.rule(*(event.get(name) for name in kind.rule_fields))
        if problem is not None:
            found.append(problem)
    return found


def _written_without_fields(event: Mapping[str, Any]) -> str | None:
    """Why the writer left an event's fields out, where its line says so (``oversized``:
    too big to write; ``unencodable``: no JSON holds it), or None."""
    big = event.get("oversized")
    if isinstance(big, dict) and "bytes" in big:
        size = big["bytes"]
        shown = f"{size:,}" if isinstance(size, int) else repr(size)
        return (f"written without its fields by the writer: {shown} bytes, over "
                "OTEL_ROLLOUT_MAX_EVENT_BYTES")  # fmt: skip
    if "unencodable" in event:
        why = _short(event["unencodable"])
        return f"written without its fields by the writer, which could not encode it: {why}"
    return None


def _check_fields(
    event: dict[str, Any], fields: Mapping[str, FieldType], required: bool, found: list[str]
) -> None:
    for name, ftype in fields.items():
        if name not in event:
            if required:
                found.append(f"missing required field {name!r}")
            continue
        problem = ftype.check(event[name])
        if problem is not None:
            found.append(f"field {name!r} {problem} (got {_short(event[name])})")


def _short(value: Any) -> str:
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)  # JSON has no NaN or infinity: orjson would say null
    try:
        text = orjson.dumps(value, default=repr).decode()
    except TypeError:  # nested past orjson's depth limit
        text = reprlib.repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _object_schema(fields: Mapping[str, FieldType], required: list[str]) -> dict[str, Any]:
    return {
        "required": required,
        "properties": {name: dict(ftype.schema) for name, ftype in fields.items()},
    }


def json_schema() -> dict[str, Any]:
    """The format as a JSON Schema (draft 2020-12) describing one line of a trace file."""
    branches = []
    for name, kind in EVENTS.items():
        then = _object_schema({**kind.required, **kind.optional}, list(kind.required))
        then["description"] = kind.doc
        branches.append({"if": {"properties": {"event": {"const": name}}}, "then": then})
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://otel-rollout.dev/schema/rollout-trace-v1.json",
        "title": f"otel-rollout trace event (schema {SCHEMA_VERSION})",
        "description": "One line of rollout_trace.jsonl. Unknown fields are allowed and kept.",
        "type": "object",
        **_object_schema(COMMON_FIELDS, list(COMMON_FIELDS)),
        "additionalProperties": True,
        "allOf": branches,
    }


def shipped_json_schema() -> dict[str, Any]:
    """The JSON Schema file installed with the package."""
    from importlib import resources  # imports tempfile and shutil: ~10 ms of every start-up

    text = resources.files("otel_rollout").joinpath("schema.json").read_bytes()
    return orjson.loads(text)


def markdown_reference() -> str:
    """The field reference of docs/schema.md, rendered from :data:`EVENTS`."""
    rows = [
        "| event | required fields | optional fields | meaning |",
        "|---|---|---|---|",
    ]

    def fields(spec: Mapping[str, FieldType]) -> str:
        return "<br>".join(f"`{name}` ({ftype.name})" for name, ftype in spec.items()) or "—"

    common = fields(COMMON_FIELDS)
    rows.append(f"| *every line* | {common} | any other field (kept by readers) | |")
    for name, kind in EVENTS.items():
        rows.append(
            f"| `{name}` | {fields(kind.required)} | {fields(kind.optional)} | {kind.doc} |"
        )
    return "\n".join(rows) + "\n"


_PYTHON_TYPES: Mapping[str, Any] = {
    "integer": int,
    "number": float,
    "string": str,
    "array": list,
    "object": dict,
}


def _python_type(name: str) -> Any:
    """The Python type every kind agrees ``name`` has, or Any where kinds disagree."""
    types = {
        str(kind_fields[name].schema.get("type"))
        for kind in EVENTS.values()
        for kind_fields in (kind.required, kind.optional)
        if name in kind_fields
    }
    if len(types) == 1:
        return _PYTHON_TYPES.get(types.pop(), Any)
    return Any


def struct_type(name: str, fields: Iterable[str]) -> type[msgspec.Struct]:
    """A ``msgspec.Struct`` of the common fields and ``fields``, typed as the schema types them.

    For readers that need a few fields of every line (``EventReader(as_type=...)``):
    msgspec skips the other fields without building them.  Fields a kind lacks are None.
    """
    common: list[Any] = [("event", str), ("t", float), ("run_id", str)]
    optional = [(f, _python_type(f) | None, None) for f in fields if f not in COMMON_FIELDS]
    return msgspec.defstruct(name, common + optional, gc=False)


def json_schema_text() -> bytes:
    """:func:`json_schema` as the bytes of the shipped file."""
    return orjson.dumps(json_schema(), option=orjson.OPT_INDENT_2) + b"\n"

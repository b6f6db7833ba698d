"""The typed events: one ``msgspec.Struct`` per event kind, generated from the schema table.

This is the one shape every analysis reads, and the one policy for what a
reader keeps.  Each struct carries the schema's rules as msgspec constraints
(an integer ≥ 0, a non-empty string, a decimal version key, ...), plus the
kind's rule across fields, so that decoding a line *is* validating it, in C:

* a line that decodes is an event ``validate`` finds nothing wrong with;
* a line the decoder rejects takes :func:`from_line`, the slow path: it is
  parsed as plain JSON (integers of any size kept exact) and checked by
  :func:`otel_rollout.schema.problems`, the validator's own words.  An event
  ``validate`` calls an error is skipped with those words; an unknown kind is
  ignored (``validate`` warns about it); anything else is kept.

A hypothesis test feeds the same hostile lines to ``validate`` and to this
module and checks that they agree on every line.
"""

from __future__ import annotations

import codecs
import operator
import threading
from collections.abc import Mapping
from typing import Any, ClassVar, Union

import msgspec

from . import schema
from .constants import MOST_DIGITS

__all__ = [
    "DECODER",
    "EVENT_TYPES",
    "LINES_DECODER",
    "Event",
    "decode_plain",
    "from_line",
    "from_object",
    "parse_problem",
    "problems",
]

_UNKNOWN = "unknown event kind"


def _struct(kind: str, spec: schema.EventKind) -> type[msgspec.Struct]:
    """The struct of one kind: common fields, then required, then optional ones (None if
    absent; a null where the schema wants a value is rejected, as ``validate`` does)."""
    fields: list[Any] = [(n, f.shape) for n, f in schema.COMMON_FIELDS.items() if n != "event"]
    fields += [(n, f.shape) for n, f in spec.required.items()]
    fields += [(n, f.shape, None) for n, f in spec.optional.items()]
    namespace: dict[str, Any] = {"__annotations__": {"event": ClassVar[str]}, "event": kind}
    rule = spec.rule
    if rule is not None:
        names = spec.rule_fields
        values = (  # in C: a lambda per seal cost ~10%
            operator.attrgetter(*names) if len(names) > 1 else lambda s: (getattr(s, names[0]),)
        )

        def check(self: Any) -> None:
            problem = rule(*values(self))
            if problem is not None:
                raise ValueError(problem)

        post_init = check
        if "tokens_by_version" in names:  # the one field with version keys
            at = names.index("tokens_by_version")

            def check_and_count(self: Any) -> None:  # one frame a seal: check's body inlined
                got = values(self)
                counts = got[at]
                if counts and 0 in counts:  # maybe written "-0": see zero_keys
                    _ZERO_KEYS.n += 1
                problem = rule(*got)
                if problem is not None:
                    raise ValueError(problem)

            post_init = check_and_count
        namespace["__post_init__"] = post_init
    name = "".join(part.capitalize() for part in kind.replace(".", "_").split("_"))
    return msgspec.defstruct(
        name,
        fields,
        namespace=namespace,
        tag_field="event",
        tag=kind,
        kw_only=True,
        gc=False,  # events hold no cycles; untracked structs decode ~10% faster
        module=__name__,
    )


#: Every kind's struct, by kind.
EVENT_TYPES: Mapping[str, type[msgspec.Struct]] = {
    kind: _struct(kind, spec) for kind, spec in schema.EVENTS.items()
}

#: Any one event (a union tagged by its ``event`` field); ``e.event`` names the kind.
Event = Union[tuple(EVENT_TYPES.values())]  # type: ignore[valid-type]  # noqa: UP007

#: The fast path: decodes and validates in C (a line that does not fit raises).
DECODER: msgspec.json.Decoder[Any] = msgspec.json.Decoder(Event)
#: A block of whole lines as one JSON array of one-event arrays (see ``EventReader``'s
#: whole-block path).
LINES_DECODER: msgspec.json.Decoder[Any] = msgspec.json.Decoder(list[tuple[Event]])  # type: ignore[valid-type]
_plain: msgspec.json.Decoder[Any] = msgspec.json.Decoder()


def decode(line: bytes) -> Any:
    """One line as an event (the fast path; raises ``msgspec.ValidationError``/``DecodeError``
    if the line does not fit).

    msgspec skips a field it does not know without checking its bytes are UTF-8;
    a plain JSON parse (``validate``'s) would refuse the line, so this does too.
    """
    if not line.isascii():
        check_utf8(line)
    zeros = _ZERO_KEYS.n  # zero_keys(), inline: once a found line
    event = DECODER.decode(line)
    if _ZERO_KEYS.n != zeros:  # a version key 0: maybe written "-0"
        raise msgspec.DecodeError("a version key 0, checked by validate's rules")
    return event


#: Seals decoded so far with a version key 0, by thread (see :func:`zero_keys`).
class _ZeroKeys(threading.local):
    # 0 in a thread that has set none (a class attribute): getattr(local, "n", 0) raised and
    # caught an AttributeError every time until then, ~0.95 us, twice a line decoded.
    n = 0


_ZERO_KEYS = _ZeroKeys()


def zero_keys() -> int:
    """How many seals this thread has decoded with a version key 0.  msgspec reads a key
    ``"-0"`` as 0 too (``"-\\u0030"`` and other escapes alike), where ``validate`` refuses
    it: a line or block whose decoding raised this count takes the slow path, the
    validator's rules (:func:`from_line`).  Version 0 is a run's first few steps, so that
    path is rare; searching every block's bytes for "-0" instead took ~10% of
    ``staleness`` and missed escapes."""
    n: int = _ZERO_KEYS.n
    return n


def check_utf8(data: bytes | memoryview) -> None:
    """Raise ``msgspec.DecodeError`` unless ``data`` is UTF-8 (one C pass; ASCII is the
    common case and callers test ``isascii()`` first)."""
    try:
        codecs.utf_8_decode(data, "strict", True)
    except UnicodeDecodeError as exc:
        raise msgspec.DecodeError(f"Invalid UTF-8 ({exc.reason} at byte {exc.start})") from None


def decode_plain(line: bytes) -> Any:
    """A line as plain JSON values, integers of any size exact (orjson refuses past 64
    bits); raises ``msgspec.DecodeError`` for what is not JSON."""
    return _plain.decode(line)


def parse_problem(exc: Exception) -> str:
    """Why a line did not parse, as every reader and ``validate`` say it: JSON that is not
    JSON, a number no float holds (``1e400``: valid JSON, but no event's), or an integer
    longer than Python reads from text (``sys.get_int_max_str_digits()``, 4,300 digits
    unless ``PYTHONINTMAXSTRDIGITS`` says otherwise)."""
    if isinstance(exc, msgspec.ValidationError):  # from the plain decoder: a number too big
        said = str(exc).split(" - at `", 1)[0].lower()
        if said.startswith("integer"):
            return f"not an event: an integer of more than {MOST_DIGITS:,} digits (Python's limit)"
        return f"not an event: {said} (past a float)"
    return f"not valid JSON: {exc}"


def from_line(line: bytes) -> tuple[Any, str | None]:
    """``(event, None)`` for a line to keep, ``(None, why)`` for one to skip with a
    warning, ``(None, None)`` for one to ignore (blank, or of a kind this version does
    not know)."""
    try:
        return decode(line), None
    except (msgspec.DecodeError, RecursionError):
        pass
    try:
        value = _plain.decode(line)
    except (msgspec.DecodeError, RecursionError) as exc:
        if not line.strip():
            return None, None
        return None, parse_problem(exc)
    return from_object(value)


def _int_keys(value: dict[str, Any]) -> dict[str, Any]:
    """``value`` with a ``tokens_by_version``'s decimal keys as ints, as msgspec wants them
    from Python (from JSON it reads them itself; int keys, from Python, are kept); a key
    that is neither raises ``ValueError``, and the checked path then names it."""
    counts = value.get("tokens_by_version")
    if counts.__class__ is not dict:
        return value
    converted = {}
    for key, n in counts.items():
        if key.__class__ is int:  # a dict made in Python (a refit's cuts give ints)
            converted[key] = n
            continue
        if not (key.__class__ is str and key.isascii() and key.isdigit()) or (
            key[0] == "0" and key != "0"
        ):
            raise ValueError(key)
        converted[int(key)] = n
    return {**value, "tokens_by_version": converted}


#: Fields kept as raw JSON (the schema's "any"): from Python they are encoded to it first.
_RAW = frozenset(
    name
    for spec in schema.EVENTS.values()
    for fields in (spec.required, spec.optional)
    for name, ftype in fields.items()
    if ftype.shape is msgspec.Raw
)


def _raw_fields(value: dict[str, Any]) -> dict[str, Any]:
    """``value`` with its "any" fields as ``msgspec.Raw``, which msgspec cannot make from a
    Python object itself (an ``attempt.resume``'s ``snapshot`` path, say)."""
    raw = {k: msgspec.Raw(msgspec.json.encode(value[k])) for k in _RAW if k in value}
    return {**value, **raw} if raw else value


def _convert(value: dict[str, Any]) -> Any:
    """``value`` as its kind's struct, every rule checked by msgspec in C, or None if it
    breaks one or is of no kind this version knows (then ask :func:`schema.problems`)."""
    name = value.get("event")
    kind = EVENT_TYPES.get(name) if name.__class__ is str else None
    if kind is None:
        return None
    try:  # to the kind's own struct: converting to the union rebuilds its lookup on every
        # call (20 µs against 0.5)
        return msgspec.convert(_int_keys(value), kind)
    except (msgspec.ValidationError, RecursionError, ValueError, TypeError):
        return None


def problems(value: Any) -> list[str]:
    """What ``validate`` says of a parsed line, in the validator's words
    (:func:`otel_rollout.schema.problems`), found fast: a line that converts to its kind's
    struct has none (0.5 µs in C against ~40 µs of Python rules; a hypothesis test holds
    the two to the same verdict on hostile lines)."""
    if value.__class__ is dict and _convert(value) is not None:
        return []
    return schema.problems(value)


def from_object(value: Any) -> tuple[Any, str | None]:
    """As :func:`from_line`, for a parsed value (a dict from ``read_events``, say)."""
    if value.__class__ is dict:
        event = _convert(value)  # the fast path: every rule checked in C
        if event is not None:
            return event, None
    found = schema.problems(value)
    errors = [p for p in found if not p.startswith(_UNKNOWN)]
    if errors:
        kind = value.get("event") if value.__class__ is dict else None
        named = f"{kind}: " if kind.__class__ is str and kind in EVENT_TYPES else ""
        return None, named + "; ".join(errors)
    if found:  # a kind this version does not know: nothing to read in it
        return None, None
    try:  # not strict: the schema's rules have passed, and version keys are strings here
        return msgspec.convert(_raw_fields(value), EVENT_TYPES[value["event"]], strict=False), None
    except (msgspec.ValidationError, RecursionError, TypeError) as exc:  # pragma: no cover
        return None, str(exc)

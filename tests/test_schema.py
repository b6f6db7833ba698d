"""The schema table, the validator built on it, and the JSON Schema generated from it."""

from __future__ import annotations

import jsonschema
import pytest
from hypothesis import given
from hypothesis import strategies as st

from otel_rollout.schema import EVENTS, json_schema, problems, shipped_json_schema
from otel_rollout.testing import TraceBuilder

VALID = {
    "run.start": {"schema": 1, "pid": 4},
    "group.reserve": {"group_id": "g", "prompt_id": 1, "size": 4, "weight_version": 0},
    "group.admit": {"group_id": "g", "prompt_id": 1},
    "group.seal": {"group_id": "g", "prompt_id": 1, "tokens": 3, "tokens_by_version": {"2": 3}},
    "group.discard": {"group_id": "g", "prompt_id": 1, "reason": "stale"},
    "attempt.dispatch": {
        "attempt_id": "a",
        "group_id": "g",
        "prompt_id": 1,
        "generation_index": 0,
        "weight_version": 2,
    },
    "attempt.resume": {
        "attempt_id": "a",
        "group_id": "g",
        "prompt_id": 1,
        "generation_index": 0,
        "weight_version": 2,
        "resumed_tokens": 10,
    },
    "attempt.seal": {
        "attempt_id": "a",
        "group_id": "g",
        "prompt_id": 1,
        "generation_index": 0,
        "tokens": 9,
        "calls": [["c1", 2, 9]],
    },
    "attempt.refuse": {
        "attempt_id": "a",
        "group_id": "g",
        "prompt_id": 1,
        "generation_index": 0,
        "reason": "stale",
    },
    "attempt.abandon": {
        "attempt_id": "a",
        "group_id": "g",
        "prompt_id": 1,
        "generation_index": 0,
        "reason": "stop",
    },
    "weights.sync": {"replaced_version": 2, "new_version": 3, "cuts": [["c1", 4]]},
    "train.step": {"step": 0, "trained_version": 2, "group_ids": ["g"], "batch_age": None},
    "checkpoint.publish": {"step": 0, "weight_version": 3},
    "checkpoint.restore": {"step": 0, "weight_version": 3},
    "trace.dropped": {"count": 7},
}


def event(kind: str, **fields) -> dict:
    return {"t": 1.5, "run_id": "r", "event": kind, **VALID[kind], **fields}


class TestProblems:
    def test_every_kind_has_a_valid_example(self):
        """The examples above cover every kind the schema knows."""
        assert set(VALID) == set(EVENTS)

    @pytest.mark.parametrize("kind", sorted(VALID))
    def test_valid_examples_have_no_problems(self, kind):
        """A well-formed event of each kind passes."""
        assert problems(event(kind)) == []

    @pytest.mark.parametrize("kind", sorted(VALID))
    def test_each_required_field_is_required(self, kind):
        """Dropping any required field is reported by name."""
        for name in EVENTS[kind].required:
            e = event(kind)
            del e[name]
            assert f"missing required field {name!r}" in problems(e)

    def test_wrong_types_are_reported(self):
        """Types are checked: negative versions, bools for ints, bad nested shapes."""
        assert problems(event("weights.sync", new_version=-1))
        assert problems(event("train.step", step=True))
        assert problems(event("attempt.seal", calls=[["c", 1]]))
        assert problems(event("group.seal", tokens_by_version={"v2": 3}))
        assert problems({"t": "yesterday", "run_id": "r", "event": "group.admit"})

    def test_unknown_kinds_and_fields(self):
        """Unknown fields are fine; an unknown kind is reported as such."""
        assert problems(event("group.admit", extra=[1])) == []
        assert problems({"t": 1, "run_id": "r", "event": "new.kind"}) == [
            "unknown event kind 'new.kind'"
        ]


class TestJsonSchema:
    def test_shipped_file_is_generated_from_the_table(self):
        """otel_rollout/schema.json is exactly what the schema table renders."""
        assert shipped_json_schema() == json_schema()

    def test_schema_is_valid_draft_2020_12(self):
        """The generated document is itself a valid JSON Schema."""
        jsonschema.Draft202012Validator.check_schema(json_schema())

    @given(
        kind=st.sampled_from(sorted(VALID)),
        drop=st.integers(0, 10),
        bad=st.sampled_from([None, -1, "x", 1.5, [], {}]),
    )
    def test_json_schema_agrees_with_the_validator(self, kind, drop, bad):
        """For mutated events, the JSON Schema and problems() accept and reject alike."""
        validator = jsonschema.Draft202012Validator(json_schema())
        e = event(kind)
        names = list(EVENTS[kind].required)
        if names and drop < len(names) * 2:
            name = names[drop % len(names)]
            if drop < len(names):
                del e[name]
            else:
                e[name] = bad
        assert validator.is_valid(e) == (problems(e) == [])

    def test_builder_output_is_valid(self):
        """Events the test builder writes pass the validator."""
        b = TraceBuilder()
        b.sealed_group("g", {1: 2})
        b.step(0, 1, ["g"])
        assert all(problems(e) == [] for e in b.events)


class TestDocs:
    def test_docs_schema_md_matches_the_table(self):
        """docs/schema.md's field reference is exactly what the schema table renders."""
        from pathlib import Path

        from otel_rollout.schema import markdown_reference

        doc = (Path(__file__).parent.parent / "docs" / "schema.md").read_text()
        begin = doc.index("-->\n", doc.index("BEGIN GENERATED")) + 4
        end = doc.index("<!-- END GENERATED")
        assert doc[begin:end] == markdown_reference()

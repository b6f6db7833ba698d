"""The one render layer: every value of the JSON appears in the text and the HTML, each
field is described once, times are ISO-8601 UTC, run IDs shortened the same way."""

from __future__ import annotations

import re
from html import escape

import orjson
import pytest

from otel_rollout.render.fields import (
    BOUNDARY_FIELDS,
    STEP_FIELDS,
    SUMMARY_FIELDS,
    Style,
    as_text,
    iso_utc,
    share,
    short_run,
)
from otel_rollout.testing import synthetic_trace


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    """cost and batch-age as JSON and text, and the report page, of one three-run trace."""
    import contextlib
    import io

    from otel_rollout.cli import run

    tmp = tmp_path_factory.mktemp("render")
    path = synthetic_trace(tmp / "t.jsonl", 4000, runs=3)

    def command(*argv: str) -> str:
        out = io.BytesIO()
        wrapper = io.TextIOWrapper(out, encoding="utf-8")
        with contextlib.redirect_stdout(wrapper), contextlib.redirect_stderr(io.StringIO()):
            assert run(list(argv)) == 0
        wrapper.flush()
        return out.getvalue().decode()

    page = tmp / "report.html"
    command("report", str(path), "-o", str(page))
    return {
        "cost_json": orjson.loads(command("cost", "--json", str(path))),
        "cost_text": command("cost", str(path)),
        "steps_json": [
            orjson.loads(x) for x in command("batch-age", "--json", str(path)).split("\n") if x
        ],
        "steps_text": command("batch-age", str(path)),
        "html": page.read_text(),
        "full_ids": command("cost", "--full-ids", str(path)),
    }


def _expected(fields, record: dict) -> list[str]:
    """Each value of ``record`` as the reports write it; a key no field describes fails."""
    by_key = {f.key: f for f in fields}
    texts = []
    for key, value in record.items():
        if key.endswith("_utc"):  # the JSON's ISO form of a time: the reports show the same
            assert by_key[key[: -len("_utc")]].kind == "time"
            texts.append(value)
            continue
        assert key in by_key, f"the JSON key {key!r} has no field description"
        texts.append(as_text(by_key[key], value))
    return texts


class TestEveryValueAppears:
    def test_cost_boundaries_and_summary(self, outputs):
        """Every boundary and summary value of cost --json is in cost's text and the page."""
        report = outputs["cost_json"]
        assert len(report["boundaries"]) == 2
        for record, fields in [
            *((b, BOUNDARY_FIELDS) for b in report["boundaries"]),
            (report["summary"], SUMMARY_FIELDS),
        ]:
            for text in _expected(fields, record):
                assert text in outputs["cost_text"], text
                assert escape(text) in outputs["html"], text
        for run_id in report["runs"]:
            assert short_run(run_id) in outputs["cost_text"]
            assert short_run(run_id) in outputs["html"]

    def test_ledger(self, outputs):
        """Every ledger bucket of cost --json, with its share, is in the text and the page."""
        ledger = outputs["cost_json"]["ledger"]
        total = ledger["generated"]
        wasted = {f"wasted: {cause}": n for cause, n in ledger["wasted"].items()}
        buckets = {"generated": total, "trained": ledger["trained"], **wasted}
        buckets["pending"] = ledger["pending"]
        for label, n in buckets.items():
            row = f"{n:,}  {share(n, total):>6}"
            assert any(label in x and row in x for x in outputs["cost_text"].splitlines())
            cells = f'<td class="n">{n:,}</td><td class="n">{share(n, total)}</td>'
            assert re.search(
                f"<th>{re.escape(escape(label))}[^<]*</th>{re.escape(cells)}", outputs["html"]
            )

    def test_steps(self, outputs):
        """Every value of every batch-age --json line is in the table and the page's table."""
        table = outputs["steps_text"].splitlines()
        assert len(outputs["steps_json"]) == len(table) - 2  # a header and a total line
        for record, line in zip(outputs["steps_json"], table[1:], strict=False):
            shares = record.pop("token_share_by_age")
            cells = line.split()
            for text in _expected(STEP_FIELDS, record):
                assert text in cells, (text, line)
            for value in shares.values():
                assert (f"{value:.1%}" if value is not None else "n/a") in cells
            assert as_text(STEP_FIELDS[-2], shares) in escape(outputs["html"]) or all(
                f"{v:.1%}" in outputs["html"] for v in shares.values() if v is not None
            )
            for text in _expected(STEP_FIELDS, record):
                assert f">{escape(text)}</td>" in outputs["html"], text


class TestFormats:
    def test_times_are_iso_utc_and_the_json_keeps_epoch_seconds(self, outputs):
        """stopped_at stays epoch seconds in the JSON, with its ISO-8601 UTC form beside it."""
        b = outputs["cost_json"]["boundaries"][0]
        assert isinstance(b["stopped_at"], float)
        assert b["stopped_at_utc"] == iso_utc(b["stopped_at"]) and b["stopped_at_utc"].endswith("Z")
        assert b["stopped_at_utc"] in outputs["cost_text"]

    def test_full_ids_are_one_flag_away(self, outputs):
        """--full-ids shows whole run IDs where the default shows their first 8 characters."""
        run_id = outputs["cost_json"]["runs"][0]
        assert len(run_id) > 8
        assert run_id not in outputs["cost_text"] and run_id in outputs["full_ids"]
        assert short_run(run_id, Style(full_ids=True)) == run_id

    def test_a_share_of_nothing_is_not_zero_percent(self):
        """A percentage of a zero total prints as n/a."""
        assert share(0, 0) == "n/a" and share(1, 4) == "25.0%"

    def test_absurd_values_print(self):
        """Infinite ages and times past what a date holds print, not raise."""
        age = next(f for f in STEP_FIELDS if f.key == "batch_age")
        assert as_text(age, float("inf")) == "inf"
        assert "epoch" in iso_utc(1e300)


def test_counts_are_singular_for_one_and_grouped_by_thousands():
    """Every summary line counts in words the one way: 1 run, 2 runs, 12,819 steps."""
    from otel_rollout.render.words import counted

    assert counted(1, "run") == "1 run"
    assert counted(0, "run") == "0 runs"
    assert counted(12_819, "step") == "12,819 steps"
    assert counted(1, "stop and restore", "stops and restores") == "1 stop and restore"
    assert counted(2, "stop and restore", "stops and restores") == "2 stops and restores"

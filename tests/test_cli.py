"""The otel-rollout command line, run as a real subprocess."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import orjson
import pytest

from otel_rollout.reader import EventReader
from otel_rollout.testing import TraceBuilder


@pytest.fixture
def trace_file(tmp_path):
    b = TraceBuilder()
    b.sealed_group("g1", {3: 100, 4: 200})
    b.sealed_group("g2", {5: 50})
    b.sealed_group("g3", None)
    b.step(0, 5, ["g1"])
    b.step(1, 6, ["g2", "g3"])
    b.step(2, 6, ["g3"])
    return b.write(tmp_path / "rollout_trace.jsonl")


def assert_clean_error(proc, code: int) -> None:
    assert proc.returncode == code, proc.stderr
    assert "Traceback" not in proc.stderr


class TestReferenceMain:
    def test_prints_step_then_batch_age(self, trace_file):
        """python -m otel_rollout.trace FILE prints 'step age' per step with counts."""
        proc = subprocess.run(
            [sys.executable, "-m", "otel_rollout.trace", str(trace_file)],
            capture_output=True,
            text=True,
            check=True,
        )
        assert proc.stdout.splitlines() == [f"0 {5 - 1100 / 300:.6f}", "1 1.000000"]
        assert proc.stderr == ""

    def test_missing_file(self, tmp_path):
        """A missing file is one line on stderr and exit code 2."""
        proc = subprocess.run(
            [sys.executable, "-m", "otel_rollout.trace", str(tmp_path / "none")],
            capture_output=True,
            text=True,
        )
        assert_clean_error(proc, 2)


class TestBatchAge:
    @pytest.mark.parametrize("full_ids", [False, True])
    def test_columns_stay_aligned_past_their_usual_width(self, cli, tmp_path, full_ids):
        """A step and a version of 10**12 and a long run ID widen their columns: every line
        of the table (header and rows) is as long as the next, each cell under its header."""
        b = TraceBuilder(run_id="a-run-id-longer-than-thirty-two-characters")
        b.sealed_group("g1", {0: 10})
        b.step(1, 1, ["g1"])
        b.sealed_group("g2", {10**12 - 1: 5})
        b.step(10**12, 10**12, ["g2"])
        path = b.write(tmp_path / "t.jsonl")
        proc = cli("batch-age", *(["--full-ids"] if full_ids else []), str(path))
        table = proc.stdout.splitlines()[:3]
        assert len({len(line) for line in table}) == 1, table
        assert "1,000,000,000,000" in table[2]
        header_end = table[0].index("batch age") + len("batch age")
        assert table[1][:header_end].endswith("1.0000") and table[2][:header_end].endswith("1.0000")

    def test_table(self, cli, trace_file):
        """The table has a row per step with version, groups, tokens, age and age shares."""
        proc = cli("batch-age", str(trace_file))
        assert proc.returncode == 0, proc.stderr
        rows = proc.stdout.splitlines()
        assert rows[0].split() == [
            "step",
            "version",
            "groups",
            "tokens",
            "batch",
            "age",
            "age0",
            "age1",
            "age2",
            "age3+",
            "run",
        ]
        assert rows[1].split()[:9] == [
            "0", "5", "1", "300", "1.3333", "0.0%", "66.7%", "33.3%", "0.0%"
        ]  # fmt: skip
        assert rows[3].split()[4] == "-"

    def test_json(self, cli, trace_file):
        """--json prints one object per step; steps without counts have null batch age."""
        proc = cli("batch-age", str(trace_file), "--json")
        rows = [orjson.loads(line) for line in proc.stdout.splitlines()]
        assert [r["step"] for r in rows] == [0, 1, 2]
        assert rows[0]["batch_age"] == 5 - 1100 / 300 and rows[2]["batch_age"] is None
        assert rows[1]["token_share_by_age"] == {
            "age0": 0.0,
            "age1": 1.0,
            "age2": 0.0,
            "age3+": 0.0,
        }

    @pytest.mark.parametrize(
        "content, message",
        [(None, "no such file"), (b"\x00\x01\x02 not a trace\n", "not a trace file")],
    )
    def test_errors_are_one_line_exit_2(self, cli, tmp_path, content, message):
        """Missing files and files that are not traces: exit 2, a clear line, no traceback."""
        path = tmp_path / "f"
        if content is not None:
            path.write_bytes(content)
        proc = cli("batch-age", str(path))
        assert_clean_error(proc, 2)
        assert message in proc.stderr

    @pytest.mark.parametrize(
        "command",
        [["batch-age"], ["cost"], ["staleness"], ["report", "-o", "{tmp}/r.html"],
         ["timeline", "-o", "{tmp}/t.json"], ["export"]],
    )  # fmt: skip
    def test_a_file_that_is_no_trace_gets_one_line(self, cli, tmp_path, command):
        """A text file whose lines name event kinds (a README read by mistake) gets the one
        "not a trace file" error from every read command, without a warning per line."""
        path = tmp_path / "notes.md"
        lines = [f"- train.step and attempt.seal {i}\n" for i in range(40)]
        path.write_text("# notes\n" + "".join(lines))
        args = [a.format(tmp=tmp_path) for a in command]
        proc = cli(*args, str(path))
        assert_clean_error(proc, 2)
        assert proc.stderr.strip().splitlines() == [
            f"otel-rollout: error: {path}: not a trace file (none of its lines is a JSON event)"
        ]

    def test_a_trace_after_a_bad_first_line_warns_of_every_bad_line_in_order(
        self, cli, tmp_path, trace_file
    ):
        """A trace whose line 1 is damaged is still a trace: its bad lines are warned of, by
        line and in order, before the result."""
        lines = trace_file.read_bytes().splitlines(keepends=True)
        bad = b'{"t": 1, "event": "train.step", "step": -1}\n'
        path = tmp_path / "t.jsonl"
        path.write_bytes(b"garbage\n" + b"".join(lines[:3]) + bad + b"".join(lines[3:]))
        proc = cli("batch-age", "--json", str(path))
        assert proc.returncode == 0, proc.stderr
        warned = [w.split(f"{path}:")[1].split(":")[0] for w in proc.stderr.splitlines()]
        assert warned == ["1", "5"] and proc.stdout

    def test_the_reader_says_in_one_warning_a_file_is_no_trace(self, tmp_path, caplog):
        """Read through the API, a file that is no trace gets one warning with its count of
        lines, not one per line."""
        path = tmp_path / "notes.txt"
        path.write_text("".join(f"line {i}\n" for i in range(30)))
        with caplog.at_level("WARNING", logger="otel_rollout"):
            assert list(EventReader(path)) == []
        assert [r.getMessage() for r in caplog.records] == [
            f"{path}: not a trace file (none of its lines is a JSON event); 30 lines skipped"
        ]

    def test_a_bad_first_line_is_told_before_the_pass_warns_and_when_reading_stops(
        self, cli, tmp_path, trace_file
    ):
        """A held warning about line 1 is told as soon as the file shows an event: before
        the pass's own warnings about later lines, and through the API even when the
        reading stops after a few events."""
        lines = trace_file.read_bytes().splitlines(keepends=True)
        unsealed = b'{"t": 9, "run_id": "r", "event": "train.step", "step": 99, ' \
                   b'"trained_version": 1, "group_ids": ["nosuch"]}\n'
        path = tmp_path / "t.jsonl"
        path.write_bytes(b"garbage\n" + b"".join(lines) + unsealed)
        proc = cli("batch-age", str(path))
        where = [w.split(f"{path}:")[1].split(":")[0] for w in proc.stderr.splitlines()]
        assert where == ["1", str(len(lines) + 2)], proc.stderr
        script = (
            "import itertools, gc; from otel_rollout import read_events; "
            f"it = read_events({str(path)!r}); list(itertools.islice(it, 2)); "
            "del it; gc.collect()"
        )
        api = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
        assert f"{path}:1: not valid JSON" in api.stderr

    def test_the_reference_functions_say_in_one_warning_a_file_is_no_trace(
        self, tmp_path, caplog
    ):
        """batch_age_by_step and cost.analyze_file on a file that is no trace give one
        warning with its count of lines, as read_events does, and an empty result."""
        from otel_rollout.batch_age import batch_age_by_step
        from otel_rollout.cost import analyze_file

        path = tmp_path / "notes.md"
        path.write_text("".join(f"- train.step and group.seal {i}\n" for i in range(30)))
        with caplog.at_level("WARNING", logger="otel_rollout"):
            assert batch_age_by_step(path) == {}
            assert analyze_file(path).runs == []
        said = [r.getMessage() for r in caplog.records]
        assert said == [f"{path}: not a trace file (none of its lines is a JSON event); "
                        "30 lines skipped"] * 2  # fmt: skip

    def test_directory_is_a_usage_error(self, cli, tmp_path):
        """Passing the log directory says which file to pass instead."""
        proc = cli("batch-age", str(tmp_path))
        assert_clean_error(proc, 2)
        assert "rollout_trace.jsonl" in proc.stderr

    def test_malformed_step_is_named_by_line(self, cli, tmp_path, trace_file):
        """A train.step with a missing field is skipped with a warning naming its line."""
        with open(trace_file, "ab") as f:
            f.write(b'{"t":1,"run_id":"r","event":"train.step","step":9}\n')
        n = len(trace_file.read_bytes().splitlines())
        proc = cli("batch-age", str(trace_file))
        assert proc.returncode == 0
        assert f"{trace_file}:{n}: train.step: missing required field" in proc.stderr


class TestValidate:
    def test_valid_file_exits_0(self, cli, trace_file):
        """A clean file: exit 0 and a summary on stderr."""
        proc = cli("validate", str(trace_file))
        assert proc.returncode == 0 and "0 errors" in proc.stderr

    def test_problems_have_line_numbers_and_exit_1(self, cli, trace_file):
        """Every violation is printed as FILE:LINE: severity: problem; errors exit 1."""
        with open(trace_file, "ab") as f:
            f.write(b'{"t":1,"run_id":"r","event":"weights.sync","replaced_version":-2}\n')
            f.write(b"garbage\n")
            f.write(b'{"t":1,"run_id":"r","event":"future.kind"}\n')
        n = len(trace_file.read_bytes().splitlines())
        proc = cli("validate", str(trace_file))
        assert_clean_error(proc, 1)
        out = proc.stdout
        assert f"{trace_file}:{n - 2}: error: field 'replaced_version'" in out
        assert f"{trace_file}:{n - 2}: error: missing required field 'new_version'" in out
        assert f"{trace_file}:{n - 1}: error: not valid JSON" in out
        assert f"{trace_file}:{n}: warning: unknown event kind 'future.kind'" in out

    def test_summary_counts_the_events_readers_read(self, cli, trace_file):
        """The summary's event count leaves out lines every command's reader skips (they parse
        but break the schema's rules) and names them, so it equals what that reader reads."""
        with open(trace_file, "ab") as f:
            f.write(b'{"t":1,"run_id":"r","event":"weights.sync","replaced_version":-2}\n')
            f.write(b"not json\n")  # skipped by every reader too, before any rule
            f.write(b'{"t":1,"run_id":"r","event":"future.kind"}\n')
        events = sum(len(batch) for batch in EventReader(trace_file, typed=True).batches())
        proc = cli("validate", str(trace_file))
        aside = "(2 invalid lines skipped by readers; 1 of unknown kind passed over)"
        assert f" {events} events {aside}, " in proc.stderr

    def test_torn_last_line_is_a_warning_unless_strict(self, cli, trace_file):
        """A killed writer's torn line warns (exit 0); --strict makes it an error (exit 1)."""
        with open(trace_file, "ab") as f:
            f.write(b'{"t":1,"run_')
        assert cli("validate", str(trace_file)).returncode == 0
        assert cli("validate", "--strict", str(trace_file)).returncode == 1

    def test_json_output(self, cli, trace_file):
        """--json prints each problem as an object with line, severity and problem, then the
        counts (a clean file: only those)."""
        with open(trace_file, "ab") as f:
            f.write(b"[]\n")
        n = len(trace_file.read_bytes().splitlines())
        proc = cli("validate", "--json", str(trace_file))
        *problems, last = [orjson.loads(line) for line in proc.stdout.splitlines()]
        (problem,) = problems
        assert problem["severity"] == "error" and problem["line"] == n
        summary = last["summary"]  # the counts close the output, for a script to read
        assert summary["lines"] == n and summary["errors"] == 1 and summary["warnings"] == 0
        clean = trace_file.with_name("clean.jsonl")
        clean.write_bytes(trace_file.read_bytes().rsplit(b"[]", 1)[0])
        out = cli("validate", "--json", str(clean)).stdout
        (only,) = [orjson.loads(line) for line in out.splitlines()]
        assert only["summary"]["errors"] == 0 and only["summary"]["events"] == n - 1


class TestGeneral:
    def test_help_lists_commands(self, cli):
        """--help names every command."""
        out = cli("--help").stdout
        for command in ("batch-age", "validate", "simulate", "demo", "schema"):
            assert command in out

    def test_unknown_option_is_usage_error(self, cli):
        """argparse usage errors exit 2 without a traceback."""
        assert_clean_error(cli("batch-age", "--bogus"), 2)

    @pytest.mark.parametrize("command", ["cost", "watch"])
    @pytest.mark.parametrize("window", ["-1", "0", "two"])
    def test_a_window_of_no_steps_is_a_usage_error(self, cli, trace_file, command, window):
        """``--window`` below 1 or not a number is one usage line, exit 2, for each command."""
        done = cli(command, "--window", window, str(trace_file))
        assert_clean_error(done, 2)
        assert f"must be a whole number of at least 1, got '{window}'" in done.stderr

    def test_schema_command_prints_the_shipped_schema(self, cli):
        """'otel-rollout schema' prints the JSON Schema file shipped with the package."""
        from otel_rollout.schema import shipped_json_schema

        assert orjson.loads(cli("schema").stdout) == shipped_json_schema()


def test_validate_refuses_a_negative_report_limit(tmp_path, cli):
    """--max-report -1 is a usage error (it was taken, and miscounted the problems not
    shown)."""
    path = tmp_path / "t.jsonl"
    path.write_text('{"t": 1, "run_id": "r", "event": "group.admit"}\n')
    proc = cli("validate", "--max-report", "-1", str(path))
    assert proc.returncode == 2 and "must be 0 or more" in proc.stderr


@pytest.mark.parametrize(
    "command",
    [["batch-age", "--json"], ["cost", "--json"], ["staleness", "--json"], ["validate"],
     ["watch", "--once"], ["timeline", "-o", "OUT/t.json"], ["report", "-o", "OUT/r.html"]],
    ids=lambda c: c[0],
)  # fmt: skip
def test_a_log_directory_reads_as_the_log_inside_it(demo_trace, tmp_path, cli, command):
    """A command given the directory a run logged into (its --log-dir) reads the
    rollout_trace.jsonl inside, with the output it gives for the file; a directory with
    no log is one line, exit 2."""
    outputs = []
    for n, target in enumerate((demo_trace, demo_trace.parent)):
        args = [a.replace("OUT", str(tmp_path / str(n))) for a in command]
        proc = cli(args[0], str(target), *args[1:])
        assert proc.returncode == 0, proc.stderr
        written = sorted((tmp_path / str(n)).glob("*"))
        shown = proc.stdout
        if command[0] == "watch":  # its frame says how long ago things were: not those lines
            shown = [line for line in shown.splitlines() if "step " in line or "age" in line]
        outputs.append((shown, [p.read_bytes() for p in written]))
    assert outputs[0] == outputs[1]
    empty = tmp_path / "empty"
    empty.mkdir()
    args = [a.replace("OUT", str(tmp_path / "x")) for a in command]
    proc = cli(args[0], str(empty), *args[1:])
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "is a directory, with no rollout_trace.jsonl(.gz) in it" in proc.stderr


def test_the_reference_main_reads_a_log_directory(demo_trace, tmp_path):
    """python -m otel_rollout.trace DIR prints what it prints for the log inside DIR."""
    runs = [
        subprocess.run(
            [sys.executable, "-m", "otel_rollout.trace", str(p)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        for p in (demo_trace, demo_trace.parent)
    ]
    assert runs[0].returncode == runs[1].returncode == 0
    assert runs[0].stdout == runs[1].stdout and runs[0].stdout


@pytest.mark.parametrize(
    ("args", "words"),
    [(["--steps", "5"], "every kill must come before the last step (4 with --steps 5)"),
     (["--kill-at", "30"], "every kill must come before the last step"),
     (["--kill-at", ""], "--kill-at names no step")],
)  # fmt: skip
def test_demo_refuses_kills_it_cannot_make_before_it_runs(tmp_path, cli, args, words):
    """Kill steps the run never reaches (or none) are one line, exit 2, before anything is
    simulated or written."""
    proc = cli("demo", "--log-dir", str(tmp_path / "d"), *args, timeout=30)
    assert proc.returncode == 2 and words in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "d").exists()


def test_a_kill_that_lands_after_the_last_step_ends_the_demo_there(tmp_path, capsys):
    """A run fast enough to train its last step before the kill lands (here the kill waits
    3 s) is not resumed: the demo says so and stops, with the kill recorded, no error."""
    from otel_rollout.cli._demo import run_with_kills

    options = ["--steps=6", "--speed=1000", "--quiet"]
    killed = run_with_kills(tmp_path, options, [3], delay=3.0, last_step=5)
    assert [step for _, step in killed] == [5]
    assert "nothing is left to resume" in capsys.readouterr().err
    log = EventReader(tmp_path / "rollout_trace.jsonl")
    assert [e["event"] for e in log].count("run.start") == 1  # no resumed run


@pytest.mark.skipif(sys.version_info < (3, 11), reason="PYTHONSAFEPATH is Python 3.11's")
def test_the_demo_runs_from_a_directory_holding_another_otel_rollout(tmp_path, monkeypatch):
    """Run from a directory with a package of the same name in it (an old checkout, say),
    the demo's simulated run still imports this one."""
    from otel_rollout.cli._demo import run_with_kills

    shadow = tmp_path / "elsewhere" / "otel_rollout"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text('raise SystemExit("the other otel_rollout")\n')
    monkeypatch.chdir(shadow.parent)
    log_dir = tmp_path / "d"
    run_with_kills(log_dir, ["--steps=2", "--speed=1000", "--quiet"], [], last_step=1)
    log = EventReader(log_dir / "rollout_trace.jsonl")
    assert [e["event"] for e in log].count("train.step") == 2


@pytest.mark.parametrize(
    "command",
    [["batch-age"], ["batch-age", "--json"], ["cost"], ["cost", "--json"], ["staleness"],
     ["staleness", "--json"], ["watch", "--once"], ["-m", "otel_rollout.trace"]],
    ids=" ".join,
)  # fmt: skip
def test_a_full_disk_under_stdout_is_one_line(demo_trace, command):
    """Output into a full device (/dev/full) is one line naming the output, exit 2, never a
    traceback (the reference command blamed the trace file)."""
    argv = ([*command, str(demo_trace)] if command[0] == "-m"
            else ["-m", "otel_rollout", command[0], str(demo_trace), *command[1:]])  # fmt: skip
    with open("/dev/full", "w") as full:
        proc = subprocess.run([sys.executable, *argv], stdout=full, stderr=subprocess.PIPE,
                              text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "cannot write the output: No space left on device" in proc.stderr
    assert "Traceback" not in proc.stderr and str(demo_trace) not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_an_output_file_that_cannot_be_written_is_one_line(demo_trace, tmp_path, cli):
    """timeline -o into a full device, and report --png naming a file, are one line, exit
    2; the report writes nothing when its --png cannot be used."""
    proc = cli("timeline", str(demo_trace), "-o", "/dev/full")
    assert proc.returncode == 2 and "/dev/full: cannot write (No space left" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert stat.S_ISCHR(os.stat("/dev/full").st_mode)  # its partial output removed, not it
    afile = tmp_path / "afile"
    afile.write_text("")
    page = tmp_path / "r.html"
    proc = cli("report", str(demo_trace), "--png", str(afile), "-o", str(page))
    assert proc.returncode == 2 and "is a file; name a directory" in proc.stderr
    assert not page.exists() and "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    "args",
    [["log-to", "tensorboard:TMP/tb", "FILE", "--timeout", "nan"],
     ["log-to", "tensorboard:TMP/tb", "FILE", "--timeout", "-1"],
     ["export", "FILE", "--follow", "--linger", "inf"],
     ["timeline", "FILE", "-o", "TMP/t.json", "--counter-ms", "inf"],
     ["simulate", "--log-dir", "TMP/s", "--hold", "nan"]],
    ids=lambda a: " ".join(a[-2:]),
)  # fmt: skip
def test_an_amount_that_is_no_number_of_seconds_is_a_usage_error(demo_trace, tmp_path, cli, args):
    """A NaN, infinite or negative time is one line, exit 2 (a NaN timeout made a traceback,
    an infinite one another, a negative one was taken)."""
    filled = [a.replace("TMP", str(tmp_path)).replace("FILE", str(demo_trace)) for a in args]
    proc = cli(*filled)
    bounds = " over 0 and at most 1e+09, got" if args[0] == "log-to" else " from 0 to 1e+09, got"
    assert proc.returncode == 2 and bounds in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def test_log_to_refuses_a_timeout_of_0(demo_trace, tmp_path, cli):
    """log-to --timeout 0 could only fail (nothing is waited for): a usage error."""
    proc = cli("log-to", f"tensorboard:{tmp_path}/tb", str(demo_trace), "--timeout", "0")
    assert proc.returncode == 2 and "over 0 and at most 1e+09, got '0'" in proc.stderr
    assert not (tmp_path / "tb").exists()


def test_follow_refuses_a_gzipped_log(demo_trace, tmp_path, cli):
    """export --follow on a gzipped log is one line, exit 2: it follows plain bytes."""
    import gzip

    gz = tmp_path / "rollout_trace.jsonl.gz"
    gz.write_bytes(gzip.compress(demo_trace.read_bytes()))
    for target in (gz, tmp_path):  # the file, and the log directory that holds only it
        proc = cli("export", str(target), "--follow", "--linger", "1", "--endpoint",
                   "http://127.0.0.1:9")  # fmt: skip
        assert proc.returncode == 2 and "gzipped; --follow follows a plain log" in proc.stderr


@pytest.mark.parametrize(
    "args",
    [
        ("cost", "FILE", "--window", "100000000000000000000"),
        ("watch", "FILE", "--once", "--window", "100000000000000000000"),
        ("log-to", "tensorboard:TMP/tb", "FILE", "--timeout", "1e300"),
        ("simulate", "--log-dir", "TMP/sim", "--steps", "1", "--hold", "1e300"),
        ("simulate", "--log-dir", "TMP/sim", "--group-size", "100000000000000000000"),
    ],
)
def test_numbers_past_what_a_command_can_use_are_usage_errors(args, demo_trace, tmp_path, cli):
    """A window, wait or size too big to use is a one-line usage error (exit 2), before any
    work: they made tracebacks, or a simulated group took memory without end."""
    argv = [a.replace("FILE", str(demo_trace)).replace("TMP", str(tmp_path)) for a in args]
    proc = cli(*argv)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    [error] = [line for line in proc.stderr.splitlines() if "error:" in line]  # after the usage
    assert ("must be" in error and "at most" in error) or "from 0 to" in error
    assert not (tmp_path / "sim").exists()


def test_demo_replaces_only_a_demos_own_files(tmp_path, cli):
    """The demo never deletes a trace it did not write (one line, exit 2, the file kept),
    and replaces its own, saying so."""
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    trace = theirs / "rollout_trace.jsonl"
    trace.write_text('{"t": 1, "run_id": "r", "event": "run.start", "schema": 1, "pid": 1}\n')
    proc = cli("demo", "--log-dir", str(theirs), "--steps", "4", "--kill-at", "1", timeout=60)
    assert proc.returncode == 2 and "no demo wrote it" in proc.stderr
    assert trace.read_text().count("\n") == 1
    ours = tmp_path / "ours"
    fast = ("--steps", "6", "--kill-at", "2", "--speed", "50", "--quiet")
    assert cli("demo", "--log-dir", str(ours), *fast, timeout=120).returncode == 0
    again = cli("demo", "--log-dir", str(ours), *fast, timeout=120)
    assert again.returncode == 0 and f"replacing the demo already in {ours}" in again.stderr
    # A run of the user's own into the demo's directory takes the demo's mark away, and a
    # simulated run written the demo's way (--name=value) is no demo's either.
    run = ("--steps=3", "--speed=50", "--quiet")
    assert cli("simulate", "--log-dir", str(ours), "--overwrite", *run, timeout=120).returncode == 0
    mine = tmp_path / "mine"
    assert cli("simulate", "--log-dir", str(mine), *run, timeout=120).returncode == 0
    for kept in (ours, mine):
        lines = (kept / "rollout_trace.jsonl").read_bytes()
        proc = cli("demo", "--log-dir", str(kept), *fast, timeout=60)
        assert proc.returncode == 2 and "no demo wrote it" in proc.stderr, proc.stderr
        assert (kept / "rollout_trace.jsonl").read_bytes() == lines
    # Checkpoints without a trace are someone's too.
    project = tmp_path / "project"
    (project / "checkpoints").mkdir(parents=True)
    (project / "checkpoints" / "model.pt").write_bytes(b"weights")
    proc = cli("demo", "--log-dir", str(project), *fast, timeout=60)
    assert proc.returncode == 2 and (project / "checkpoints" / "model.pt").exists()


@pytest.mark.parametrize(
    "command",
    [["batch-age"], ["cost"], ["staleness"], ["validate"], ["validate", "--json"],
     ["watch", "--once"], ["timeline", "-o", "OUT/t.json"], ["report", "-o", "OUT/r.html"]],
    ids=lambda c: " ".join(c[:2]),
)  # fmt: skip
def test_an_empty_file_is_no_trace(tmp_path, cli, command):
    """An empty file (a wrong path, a writer that never wrote: a trace's first line is
    written at once) is one line naming it, exit 2, for every reading command; not a
    clean, empty report."""
    path = tmp_path / "empty.jsonl"
    path.write_bytes(b"")
    args = [a.replace("OUT", str(tmp_path / "out")) for a in command]
    proc = cli(args[0], str(path), *args[1:])
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert f"{path}: empty: no events" in proc.stderr
    assert proc.stdout == ""

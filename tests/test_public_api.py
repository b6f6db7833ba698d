"""The public surface: __all__ as a contract, and the reference API, name for name."""

from __future__ import annotations

import ast
import inspect
import subprocess
import sys
from pathlib import Path

import otel_rollout
from otel_rollout import trace


class TestAll:
    def test_package_all_is_exact(self):
        """The package exports exactly these names, and each one resolves."""
        assert sorted(otel_rollout.__all__) == sorted(
            [
                "BATCH_AGE_TOKENS_METRIC",
                "BATCH_AGE_VERSION_SUM_METRIC",
                "ROLLOUT_TRACE_FILENAME",
                "SCHEMA_VERSION",
                "EventExporter",
                "EventReader",
                "JsonlExporter",
                "JsonlSpanExporter",
                "OtelSettings",
                "RefitCuts",
                "RolloutTrace",
                "StepAge",
                "__version__",
                "batch_age_by_step",
                "batch_age_group_metrics",
                "configure",
                "pop_batch_age",
                "read_events",
                "step_ages",
                "tokens_by_version",
            ]
        )
        for name in otel_rollout.__all__:
            assert getattr(otel_rollout, name) is not None

    def test_trace_module_all_resolves(self):
        """Every name otel_rollout.trace exports exists."""
        for name in trace.__all__:
            assert hasattr(trace, name)


class TestReferenceApi:
    def test_constants(self):
        """The reference's constants, value for value."""
        assert trace.ROLLOUT_TRACE_FILENAME == "rollout_trace.jsonl"
        assert trace.BATCH_AGE_TOKENS_METRIC == "batch_age/trained_tokens"
        assert trace.BATCH_AGE_VERSION_SUM_METRIC == "batch_age/token_version_sum"

    def test_signatures(self):
        """The reference's functions and methods take the reference's parameters."""

        def params(f):
            return [p for p in inspect.signature(f).parameters if p != "self"]

        assert params(trace.RolloutTrace.__init__)[0] == "path"
        assert params(trace.RolloutTrace.emit) == ["event", "fields"]
        # flush's one addition, durable=, is keyword-only and off by default: flush() is as before.
        durable = inspect.signature(trace.RolloutTrace.flush).parameters["durable"]
        assert durable.kind is inspect.Parameter.KEYWORD_ONLY and durable.default is False
        assert params(trace.RolloutTrace.flush) == ["durable"]
        assert params(trace.RolloutTrace.close) == []
        assert params(trace.read_events)[0] == "path"
        assert params(trace.RefitCuts.record) == ["replaced_version", "new_version", "calls"]
        assert params(trace.RefitCuts.forget_before) == ["oldest_trainable_version"]
        assert params(trace.RefitCuts.tokens_by_version) == ["call_versions"]
        assert params(trace.tokens_by_version)[0] == "events"
        assert params(trace.batch_age_group_metrics) == ["counts"]
        assert params(trace.pop_batch_age) == ["per_group_metrics", "trained_version"]
        assert params(trace.batch_age_by_step)[0] == "events"
        assert isinstance(trace.RolloutTrace.enabled, property)

    def test_a_reference_program_runs_unchanged(self, tmp_path):
        """A controller written against the reference module runs with our import."""
        program = f"""
from pathlib import Path
from otel_rollout import trace

log = Path({str(tmp_path)!r})
t = trace.RolloutTrace(log / trace.ROLLOUT_TRACE_FILENAME)
assert t.enabled
cuts = trace.RefitCuts()
cuts.record(3, 4, [("A", 100)])
counts = cuts.tokens_by_version([("A", 3, 250), ("B", 4, 50)])
t.emit("group.seal", group_id="g", prompt_id=0, tokens=300,
       tokens_by_version={{str(v): n for v, n in counts.items()}})
metrics = {{k: [v] for k, v in trace.batch_age_group_metrics(counts).items()}}
age = trace.pop_batch_age(metrics, 5)
t.emit("train.step", step=0, trained_version=5, group_ids=["g"], batch_age=age)
t.flush()
t.close()
events = list(trace.read_events(log / trace.ROLLOUT_TRACE_FILENAME))
assert trace.batch_age_by_step(events) == {{0: age}}
assert trace.tokens_by_version(events) == {{"g": {{3: 100, 4: 200}}}}
print(age)
"""
        out = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        assert float(out.stdout) == 5 - 1100 / 300


class TestImportLayers:
    def test_constants_import_nothing_from_the_package(self):
        """The shared constants load alone: no other package module, no writer hooks."""
        code = (
            "import sys, otel_rollout.constants as c; "
            "print(sorted(m for m in sys.modules if m.startswith('otel_rollout.')))"
        )
        # otel_rollout/__init__ loads first; the constants add nothing beyond what it needs.
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        assert "otel_rollout.trace" not in out.stdout and "otel_rollout.cli" not in out.stdout
        tree = ast.parse((Path(otel_rollout.__file__).parent / "constants.py").read_text())
        relative = [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level]
        named = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        named += [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module]
        assert not relative and not [m for m in named if m.startswith("otel_rollout")]
        assert set(named) <= {"__future__", "sys"}  # the standard library's, and little of it

    def test_the_reference_main_does_not_load_the_command_line(self, tmp_path):
        """``python -m otel_rollout.trace`` prints its lines without importing the CLI."""
        code = (
            f"import sys, runpy; sys.argv = ['trace', {str(tmp_path / 'missing')!r}];\n"
            "try:\n    runpy.run_module('otel_rollout.trace', run_name='__main__')\n"
            "except SystemExit as e:\n"
            "    print(e.code, sorted(m for m in sys.modules if m.startswith('otel_rollout.cli')))"
        )
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        assert out.stdout.strip() == "2 []", out.stderr
        assert "no such file" in out.stderr

    def test_importing_the_package_loads_no_submodule(self):
        """``import otel_rollout`` defers every public name to its first use (PEP 562)."""
        code = (
            "import sys, otel_rollout; "
            "print(sorted(m for m in sys.modules if m.startswith('otel_rollout.')))"
        )
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        assert out.stdout.strip() == "[]", out.stderr

    def test_every_public_name_is_listed_by_dir(self):
        """``dir(otel_rollout)`` shows the deferred names, so completion finds them."""
        assert set(otel_rollout.__all__) <= set(dir(otel_rollout))

    def test_a_submodule_is_an_attribute_after_importing_the_package(self):
        """``import otel_rollout; otel_rollout.otel.reset()`` works, as the README says."""
        code = "import otel_rollout; otel_rollout.otel.reset(); print(otel_rollout.config.__name__)"
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        assert out.stdout.strip() == "otel_rollout.config", out.stderr

    def test_an_unknown_name_raises_attribute_error(self):
        """A name the package does not have is an AttributeError, not an ImportError."""
        try:
            otel_rollout.no_such_name  # noqa: B018
        except AttributeError as exc:
            assert "no_such_name" in str(exc)
        else:
            raise AssertionError("no AttributeError")

    def test_a_read_command_loads_no_writer_and_no_schema_file_reader(self, tmp_path):
        """``otel-rollout batch-age`` imports neither the writer, OpenTelemetry's settings,
        the JSON Schema file loader nor what only a rare path needs (each is start-up time)."""
        trace = tmp_path / "rollout_trace.jsonl"
        trace.write_bytes(b"")
        code = (
            "import sys\n"
            f"sys.argv = ['otel-rollout', 'batch-age', '--json', {str(trace)!r}]\n"
            "from otel_rollout.cli import run\n"
            "run()\n"
            "print(sorted(sys.modules))"
        )
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        loaded = set(ast.literal_eval(out.stdout.strip().splitlines()[-1]))
        assert "otel_rollout.analysis.steps" in loaded  # the command ran
        unwanted = {
            "otel_rollout.trace",
            "otel_rollout.otel",
            "otel_rollout.exporters",
            "opentelemetry",
            "importlib.resources",
            "fractions",
            "html",
        }
        assert loaded & unwanted == set()

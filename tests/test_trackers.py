"""Experiment trackers: what TensorBoard, MLflow and W&B hold equals the file's batch age and
cost, live through kill -9 and resume, backfilled by log-to, and never at the log's expense."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _tracker_readers import (
    mlflow_runs,
    mlflow_series,
    tensorboard_runs,
    wandb_history,
    wandb_runs,
)
from conftest import clean_env

from otel_rollout import config, otel
from otel_rollout.batch_age import batch_age_by_step, step_ages
from otel_rollout.reader import read_events
from otel_rollout.trace import RolloutTrace
from otel_rollout.trackers import RESTORE_METRICS, STEP_METRICS, TrackerSpecError, parse_specs
from otel_rollout.trackers._rows import SHARE_NAMES

ROOT = Path(__file__).resolve().parent.parent
CLI = (sys.executable, "-m", "otel_rollout")


def tracker_env(tmp: Path, specs: str) -> dict[str, str]:
    """The environment of a run logging into ``specs``, with every tracker's files in ``tmp``."""
    return clean_env(
        OTEL_ROLLOUT_TRACKERS=specs,
        WANDB_MODE="offline",
        WANDB_DIR=str(tmp),
        WANDB_SILENT="true",
        MLFLOW_EXPERIMENT_NAME="otel-rollout",
        TMPDIR=str(tmp),  # log-to's lock files
    )


def wait_for_sidecar(log: Path, timeout: float = 60) -> None:
    """Until the export sidecar following ``log`` has finished (its last words are logged)."""
    sidecar_log = log.with_name(log.name + ".sidecar.log")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if sidecar_log.exists() and "otel-rollout: done:" in sidecar_log.read_text():
            return
        time.sleep(0.2)
    raise AssertionError(f"the sidecar did not finish:\n{sidecar_log.read_text()}")


def cost_boundaries(log: Path) -> list[dict]:
    """``otel-rollout cost --json``'s boundaries, from the command itself."""
    out = subprocess.run(
        [sys.executable, "-m", "otel_rollout", "cost", "--json", "--full-ids", str(log)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return json.loads(out)["boundaries"]


def assert_equals_file(runs: dict, log: Path, *, float32: bool = False) -> None:
    """Every surviving step of the file is in its run's tracker run, at its step number,
    with the file's batch age and token-age shares (exact, or as a 32-bit float)."""
    close = (lambda a, b: a == pytest.approx(b, rel=1e-6)) if float32 else (lambda a, b: a == b)
    rows = step_ages(read_events(log))
    assert rows
    by_step = {r.step: r.batch_age for r in rows if r.batch_age is not None}
    assert by_step == batch_age_by_step(read_events(log))  # the rows are what it reports
    for row in rows:
        series = runs[row.run_id]
        assert close(series["rollout/tokens_trained"][row.step], row.tokens)
        if row.batch_age is not None:
            assert close(series["rollout/batch_age"][row.step], row.batch_age), row
            for age, name in SHARE_NAMES.items():
                assert close(series[name][row.step], row.share(age))


def assert_restores_equal_cost(runs: dict, log: Path) -> None:
    """Each restore's row holds what ``cost`` reports for that boundary."""
    boundaries = cost_boundaries(log)
    assert boundaries
    logged = {name for series in runs.values() for name in series}
    assert logged <= {*STEP_METRICS, *RESTORE_METRICS, "rollout/step"}  # the README's tables
    for b in boundaries:
        series = runs[b["new_run"]]
        for key in ("downtime_s", "steps_retrained", "tokens_at_risk", "resumed", "redispatched",
                    "attempts_in_flight", "tokens_recovered", "tokens_regenerated"):  # fmt: skip
            points = series[f"restore/{key}"]
            assert 1 <= len(points) <= 2  # when it caught up; again at its end if changed
            assert points[max(points)] == pytest.approx(b[key], rel=1e-6), key
        restored = series["restore/restored_step"]
        assert restored[max(restored)] == b["restored_checkpoint"]["step"]


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> Path:
    """The SIGKILL demo (two kills, two resumes) with all three trackers on, from the sidecar."""
    tmp = tmp_path_factory.mktemp("trackers")
    specs = f"tensorboard:{tmp / 'tb'},mlflow:sqlite:///{tmp / 'mlflow.db'},wandb"
    subprocess.run(
        [*CLI, "demo", "--log-dir", str(tmp / "run"), "--speed", "3"],
        env=tracker_env(tmp, specs),
        cwd=tmp,
        check=True,
        capture_output=True,
        timeout=240,
    )
    wait_for_sidecar(tmp / "run" / "rollout_trace.jsonl")
    return tmp


def test_live_tensorboard_equals_the_file(demo: Path) -> None:
    """After two kills and resumes, TensorBoard has one run per trace run, equal to the file."""
    log = demo / "run" / "rollout_trace.jsonl"
    runs = tensorboard_runs(demo / "tb")
    assert len(runs) == 3
    assert_equals_file(runs, log, float32=True)
    assert_restores_equal_cost(runs, log)


def test_live_mlflow_equals_the_file(demo: Path) -> None:
    """MLflow's runs (named after each run_id) hold the file's batch age exactly, and cost's."""
    log = demo / "run" / "rollout_trace.jsonl"
    runs = mlflow_runs(f"sqlite:///{demo / 'mlflow.db'}")
    assert len(runs) == 3
    assert_equals_file(runs, log)
    assert_restores_equal_cost(runs, log)


def test_live_wandb_equals_the_file(demo: Path) -> None:
    """W&B's offline runs, decoded with wandb's own records, hold the file's values exactly."""
    log = demo / "run" / "rollout_trace.jsonl"
    runs = wandb_runs(demo / "wandb")
    assert len(runs) == 3
    assert_equals_file(runs, log)
    assert_restores_equal_cost(runs, log)


def test_log_to_backfills_the_same_values(demo: Path, tmp_path: Path) -> None:
    """``log-to`` on the demo's file logs what the live sidecar logged."""
    log = demo / "run" / "rollout_trace.jsonl"
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    done = subprocess.run(
        [*CLI, "log-to", f"tensorboard:{tmp_path / 'tb'},mlflow:{uri}", str(log)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=tracker_env(tmp_path, ""),
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "3 runs" in done.stderr and "Traceback" not in done.stderr
    backfilled = mlflow_runs(uri)
    assert_equals_file(backfilled, log)
    assert_restores_equal_cost(backfilled, log)
    live = mlflow_runs(f"sqlite:///{demo / 'mlflow.db'}")
    assert backfilled.keys() == live.keys()
    for run_id, series in live.items():
        assert backfilled[run_id]["rollout/batch_age"] == series["rollout/batch_age"]
    assert_equals_file(tensorboard_runs(tmp_path / "tb"), log, float32=True)


def test_log_to_leaves_out_runs_a_tracker_already_holds(demo_trace: Path, tmp_path: Path) -> None:
    """A second ``log-to`` of the same file logs nothing again into TensorBoard and MLflow
    (read back with their own readers), saying so; a run appended since (a resume) is
    logged alone; ``--again`` logs the second copy."""
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'm.db'}"
    spec = f"tensorboard:{tmp_path / 'tb'},mlflow:{uri}"
    log = tmp_path / "run" / "rollout_trace.jsonl"
    log.parent.mkdir()
    lines = demo_trace.read_bytes().splitlines(keepends=True)
    starts = [n for n, line in enumerate(lines) if b'"run.start"' in line]
    log.write_bytes(b"".join(lines[: starts[-1]]))  # the first two runs

    def log_to(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*CLI, "log-to", spec, str(log), *extra],
                              capture_output=True, text=True, cwd=tmp_path,
                              env=tracker_env(tmp_path, ""), timeout=120)  # fmt: skip

    def stored() -> tuple[int, int, dict]:
        client = MlflowClient(tracking_uri=uri)
        experiment = client.get_experiment_by_name("otel-rollout")
        runs = len(client.search_runs([experiment.experiment_id]))
        files = len(list((tmp_path / "tb").glob("*/events.out.tfevents.*")))
        return runs, files, tensorboard_runs(tmp_path / "tb")

    once = log_to()
    assert once.returncode == 0
    first = stored()
    assert first[:2] == (2, 2)
    rows = int(once.stderr.split(" rows in ")[0].rsplit("→ ", 1)[1])  # steps and restores
    assert rows > sum(len(series["rollout/batch_age"]) for series in first[2].values())
    assert f"tensorboard:{tmp_path / 'tb'}: {rows} logged; mlflow:{uri}: {rows} logged" in (
        once.stderr
    )  # each tracker's own count
    again = log_to()
    assert again.returncode == 0 and "Traceback" not in again.stderr
    assert again.stderr.count("already holds 2 runs of this file") == 2  # each tracker says
    assert again.stderr.count(": 0 logged, 2 runs it already held left out") == 2
    assert stored() == first
    log.write_bytes(demo_trace.read_bytes())  # the third run, resumed into the file
    assert log_to().returncode == 0
    third = stored()
    assert third[:2] == (3, 3) and {k: v for k, v in third[2].items() if k in first[2]} == first[2]
    assert log_to("--again").returncode == 0
    assert stored()[:2] == (6, 6)


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["log-to", "neptune", "x.jsonl"], "unknown tracker 'neptune'"),
        (["log-to", "tensorboard", "x.jsonl"], "tensorboard needs a directory"),
        (["log-to", "mlflow", "missing.jsonl"], "missing.jsonl"),
        (["log-to", "tensorboard:TMP/afile", "x.jsonl"], "TMP/afile is not a directory"),
    ],
)
def test_log_to_bad_input_is_one_line(cli, args, words, tmp_path) -> None:
    """A bad spec (a tensorboard directory that is a file, too) or a missing file: one line
    on stderr, exit 2, no traceback."""
    (tmp_path / "afile").write_text("")
    words = words.replace("TMP", str(tmp_path))
    done = cli(*(a.replace("TMP", str(tmp_path)) for a in args))
    assert done.returncode == 2
    assert words in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_log_to_missing_extra_names_it(monkeypatch, capsys, tmp_path) -> None:
    """Without the tracker's library, log-to says which extra to install, in one line."""
    from otel_rollout import cli
    from otel_rollout.trackers import _spec

    monkeypatch.setitem(_spec.KINDS, "wandb", ("no_such_wandb_module", "wandb", ""))
    assert cli.run(["log-to", "wandb", str(tmp_path / "x.jsonl")]) == 2
    err = capsys.readouterr().err
    assert "pip install 'otel-rollout[wandb]'" in err and len(err.strip().splitlines()) == 1


def test_specs_parse_in_one_place(monkeypatch, caplog) -> None:
    """The variable, configure() and the keyword read specs with the one parser; a wrong
    item in the variable is left out with a warning, the others kept."""
    specs = parse_specs("tensorboard:/tmp/a, mlflow:sqlite:////tmp/m.db ,wandb,tb:/tmp/a")
    assert [str(s) for s in specs] == ["tensorboard:/tmp/a", "mlflow:sqlite:////tmp/m.db", "wandb"]
    with pytest.raises(TrackerSpecError, match="unknown tracker"):
        parse_specs("comet")
    monkeypatch.setenv("OTEL_ROLLOUT_TRACKERS", "wandb,mlflow")
    assert config.TRACKERS.resolve() == ("wandb", "mlflow")
    assert otel.settings().trackers == ("wandb", "mlflow")
    monkeypatch.setenv("OTEL_ROLLOUT_TRACKERS", "comet")  # a typo in a job script: logged, off
    assert otel.settings().trackers == ()
    monkeypatch.setenv("OTEL_ROLLOUT_TRACKERS", "bogus,wandb")  # one typo: the rest kept
    with caplog.at_level(logging.WARNING, logger="otel_rollout"):
        assert config.TRACKERS.resolve() == ("wandb",)
    assert "leaving out unknown tracker 'bogus'" in caplog.text
    assert "logging to wandb" in caplog.text
    try:
        otel.configure(trackers="tensorboard:/tmp/x")
        assert otel.settings().trackers == ("tensorboard:/tmp/x",)
        otel.configure(trackers=None)  # None leaves it
        assert otel.settings().trackers == ("tensorboard:/tmp/x",)
        with pytest.raises(ValueError, match="unknown tracker"):
            otel.configure(trackers="comet")
    finally:
        otel.reset()


def emit_steps(trace: RolloutTrace, steps: int, first: int = 0) -> None:
    """A reserve, a seal and a step per step number, with tokens of two versions."""
    for s in range(first, first + steps):
        gid = f"g{s}"
        trace.emit("group.reserve", group_id=gid, prompt_id=s, size=1, weight_version=s)
        trace.emit("group.seal", group_id=gid, prompt_id=s, tokens=30 + s,
                   tokens_by_version={str(s): 10, str(s + 1): 20 + s})  # fmt: skip
        trace.emit("train.step", step=s, trained_version=s + 2, group_ids=[gid])


def test_your_own_run_objects_are_logged_from_the_pipeline(tmp_path, monkeypatch) -> None:
    """A SummaryWriter, an active MLflow run and a wandb run of yours get the file's values."""
    import mlflow
    import wandb
    from tensorboardX import SummaryWriter

    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("OTEL_ROLLOUT_SIDECAR_LINGER", "0")
    writer = SummaryWriter(str(tmp_path / "tb" / "mine"))
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'm.db'}")
    wb = wandb.init(mode="offline", dir=str(tmp_path), name="mine", reinit="create_new")
    try:
        with mlflow.start_run() as active:
            trace = RolloutTrace(tmp_path / "log.jsonl", trackers=[writer, active, wb])
            emit_steps(trace, 12)
            trace.close()
            stats = trace.stats
        log = tmp_path / "log.jsonl"
        assert stats.other["tracker_rows_logged"] == 3 * 12
        assert stats.other["tracker_errors"] == 0
        file_rows = step_ages(read_events(log))
        assert all(r.run_id == trace.run_id for r in file_rows)
        mine = {trace.run_id: mlflow_series(mlflow.MlflowClient(), active.info.run_id)}
        assert_equals_file(mine, log)
        writer.flush()
        assert_equals_file({trace.run_id: tensorboard_runs(tmp_path / "tb")["mine"]}, log,
                           float32=True)  # fmt: skip
    finally:
        wb.finish()
        mlflow.set_tracking_uri(None)
    assert_equals_file({trace.run_id: wandb_runs(tmp_path / "wandb")["mine"]}, log)


def test_your_wandb_run_keeps_its_own_step(tmp_path, monkeypatch) -> None:
    """Your own metric, logged at your own step after that step's tracker row, is read back
    at every step: the rows leave your run's step counter alone, and none of them is lost."""
    import wandb

    from otel_rollout.trackers import TrackerHub

    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("OTEL_ROLLOUT_SIDECAR_LINGER", "0")
    wb = wandb.init(mode="offline", dir=str(tmp_path), name="mine", reinit="create_new")
    log = tmp_path / "log.jsonl"
    try:
        trace = RolloutTrace(log, trackers=[wb])
        [hub] = [e for e in trace.exporters if isinstance(e, TrackerHub)]
        for s in range(8):
            emit_steps(trace, 1, first=s)
            assert trace.flush() and hub.flush(30)
            wb.log({"loss": float(s)}, step=s)
        trace.close()
        assert trace.stats.other["tracker_rows_logged"] == 8
    finally:
        wb.finish()
    rows = wandb_history(tmp_path / "wandb", "mine")
    assert {r["_step"]: r["loss"] for r in rows if "loss" in r} == {s: s for s in range(8)}
    assert_equals_file({trace.run_id: wandb_runs(tmp_path / "wandb")["mine"]}, log)


def test_specs_in_process_mode_log_from_the_pipeline(tmp_path) -> None:
    """With export in-process, a spec is logged from the trace's own pipeline, no sidecar."""
    from otel_rollout.trackers import TrackerHub

    log = tmp_path / "log.jsonl"
    trace = RolloutTrace(log, trackers=f"tensorboard:{tmp_path / 'tb'}", export_mode="inprocess")
    assert trace._sidecar is None
    assert any(isinstance(e, TrackerHub) for e in trace.exporters)
    emit_steps(trace, 20)
    trace.close()
    assert trace.stats.other["tracker_rows_logged"] == 20
    assert_equals_file(tensorboard_runs(tmp_path / "tb"), log, float32=True)


def test_nothing_lands_in_the_repository(demo: Path) -> None:
    """Tracker output went where it was pointed, not into the working tree (run last)."""
    for name in ("mlruns", "wandb", "mlflow.db"):
        assert not (ROOT / name).exists(), name


def test_parsing_specs_imports_only_the_parser() -> None:
    """config parses OTEL_ROLLOUT_TRACKERS with the spec parser alone: the hub, which imports
    config, stays unimported (no import cycle)."""
    code = (
        "import sys, otel_rollout.config as c; c.TRACKERS.resolve(); "
        "print(sorted(m for m in sys.modules if m.startswith('otel_rollout.trackers')))"
    )
    env = clean_env(OTEL_ROLLOUT_TRACKERS="wandb,mlflow")
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    ).stdout
    assert out.strip() == "['otel_rollout.trackers', 'otel_rollout.trackers._spec']"


def test_a_run_object_that_is_no_tracker_costs_only_itself(tmp_path, caplog) -> None:
    """Beside something that is no tracker's run, a SummaryWriter still gets every row."""
    from tensorboardX import SummaryWriter

    writer = SummaryWriter(str(tmp_path / "tb" / "mine"))
    log = tmp_path / "log.jsonl"
    trace = RolloutTrace(log, trackers=[object(), writer], export_mode="inprocess")
    emit_steps(trace, 5)
    trace.close()
    assert trace.stats.other["tracker_rows_logged"] == 5
    assert "object is no tracker spec or run" in caplog.text
    writer.flush()
    assert_equals_file({trace.run_id: tensorboard_runs(tmp_path / "tb")["mine"]}, log,
                       float32=True)  # fmt: skip


def test_in_process_wandb_without_a_login_is_refused_in_one_line(tmp_path, monkeypatch, caplog):
    """In the training process, wandb with no key, no login and no offline mode is turned off
    with one line (never a login prompt on the trainer's terminal); the others go on."""
    for name in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_BASE_URL", "NETRC"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc
    monkeypatch.chdir(tmp_path)
    log = tmp_path / "log.jsonl"
    specs = f"wandb,tensorboard:{tmp_path / 'tb'}"
    trace = RolloutTrace(log, trackers=specs, export_mode="inprocess")
    emit_steps(trace, 3)
    trace.close()
    assert trace.stats.other["tracker_rows_logged"] == 3  # TensorBoard's
    lines = [r.getMessage() for r in caplog.records if "wandb" in r.getMessage()]
    assert len(lines) == 1 and "WANDB_API_KEY" in lines[0]
    assert not (tmp_path / "wandb").exists()


def test_a_relative_tensorboard_dir_is_the_trainers(tmp_path, monkeypatch) -> None:
    """tensorboard:runs/tb means runs/tb where it is parsed (the trainer), not in the
    sidecar's working directory: the spec leaves the trainer absolute."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OTEL_ROLLOUT_TRACKERS", "tensorboard:runs/tb")
    assert config.TRACKERS.resolve() == (f"tensorboard:{tmp_path / 'runs' / 'tb'}",)


def test_two_log_tos_at_once_log_each_run_once(demo_trace: Path, tmp_path: Path) -> None:
    """Two ``log-to`` of one file into one fresh TensorBoard directory, started together:
    one logs the file's runs, the other waits for it and then leaves them out, so the
    directory holds one event file per run (read back with TensorBoard's reader)."""
    spec = f"tensorboard:{tmp_path / 'tb'}"
    procs = [
        subprocess.Popen([*CLI, "log-to", spec, str(demo_trace)], stderr=subprocess.PIPE,
                         text=True, cwd=tmp_path, env=tracker_env(tmp_path, ""))
        for _ in range(2)
    ]  # fmt: skip
    errs = [proc.communicate(timeout=120)[1] for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], errs
    runs = len({json.loads(line)["run_id"] for line in demo_trace.read_text().splitlines()})
    assert len(list((tmp_path / "tb").glob("*/events.out.tfevents.*"))) == runs
    assert len(tensorboard_runs(tmp_path / "tb")) == runs
    assert sum(f"already holds {runs} runs of this file" in err for err in errs) == 1, errs


def test_a_log_to_waits_for_one_already_logging_into_its_tracker(
    demo_trace: Path, tmp_path: Path
) -> None:
    """While another process holds the tracker's lock, ``log-to`` says whom it waits for,
    logs nothing, and goes on once the lock is released."""
    import fcntl

    target = tmp_path / "tb"
    lock = _lock_file(tmp_path, f"tensorboard:{target}")
    with open(lock, "a+") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        held.truncate(0)
        held.write("4242")
        held.flush()
        proc = subprocess.Popen([*CLI, "log-to", f"tensorboard:{target}", str(demo_trace)],
                                stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                                env=tracker_env(tmp_path, ""))  # fmt: skip
        assert proc.stderr is not None
        line = proc.stderr.readline()
        assert "waiting for another log-to into tensorboard:" in line and "pid 4242" in line
        time.sleep(1)
        assert proc.poll() is None and not target.exists()
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert tensorboard_runs(target)


def test_a_log_to_that_cannot_lock_logs_and_says_so(demo_trace: Path, tmp_path: Path) -> None:
    """A lock file that cannot be opened (here a link into no directory) leaves log-to
    logging as it would alone, with one line saying two at once could both log."""
    target = tmp_path / "tb"
    _lock_file(tmp_path, f"tensorboard:{target}").symlink_to(tmp_path / "no" / "such" / "dir")
    proc = subprocess.run([*CLI, "log-to", f"tensorboard:{target}", str(demo_trace)],
                          capture_output=True, text=True, cwd=tmp_path,
                          env=tracker_env(tmp_path, ""), timeout=120)  # fmt: skip
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.count("cannot lock") == 1 and tensorboard_runs(target)


def _lock_file(tmp: Path, key: str) -> Path:
    """Where log-to locks the tracker ``key`` (in ``TMPDIR``, ``tmp`` in these tests)."""
    import hashlib

    return tmp / f"otel-rollout-log-to-{hashlib.sha256(key.encode()).hexdigest()[:20]}.lock"


def test_log_to_warns_once_about_a_bad_line(demo_trace: Path, tmp_path: Path) -> None:
    """A bad line is named once, though log-to reads the file's run IDs before it logs."""
    lines = demo_trace.read_bytes().splitlines(keepends=True)
    path = tmp_path / "t.jsonl"
    cut = b'{"t": 1, "run_id": "r", "event": "run.start"\n'  # a run.start cut short
    path.write_bytes(b"".join([*lines[:100], cut, *lines[100:]]))
    done = subprocess.run([*CLI, "log-to", f"tensorboard:{tmp_path / 'tb'}", str(path)],
                          capture_output=True, text=True, cwd=tmp_path,
                          env=tracker_env(tmp_path, ""), timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stderr.count(":101: ") == 1, done.stderr


def test_two_writers_of_one_run_in_one_second_keep_both_files(tmp_path: Path) -> None:
    """TensorBoard names an event file by the second and the host: a second sink for the same
    run in the same second (a log-to --again right after another) truncated the first's file.
    Each now has its own, and TensorBoard's reader sees every step of both."""
    from otel_rollout.trackers._sinks import TensorBoardSink
    from otel_rollout.trackers._spec import parse_specs

    [spec] = parse_specs(f"tensorboard:{tmp_path / 'tb'}")
    first = TensorBoardSink.make(spec, "run-1")
    first.log(0, {"rollout/batch_age": 1.0})
    first.close()
    second = TensorBoardSink.make(spec, "run-1")
    second.log(1, {"rollout/batch_age": 2.0})
    second.close()
    assert len(list((tmp_path / "tb" / "run-1").glob("events.out.tfevents.*"))) == 2
    assert tensorboard_runs(tmp_path / "tb")["run-1"]["rollout/batch_age"] == {0: 1.0, 1: 2.0}

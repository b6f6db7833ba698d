"""Knobs: explicit argument, then environment variable, then default."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from otel_rollout import config


class TestSetting:
    def test_a_malformed_value_is_warned_of_once(self, monkeypatch, caplog):
        """A value read again and again (each trace, each setting's use) warns once."""
        monkeypatch.setenv("OTEL_ROLLOUT_EXPORT_MODE", "foo")
        for _ in range(3):
            assert config.EXPORT_MODE.resolve() == config.EXPORT_MODE.default
        assert caplog.text.count("otel-rollout: ignoring OTEL_ROLLOUT_EXPORT_MODE='foo'") == 1

    def test_default_when_unset(self, monkeypatch):
        """With nothing set, the documented default applies."""
        monkeypatch.delenv("OTEL_ROLLOUT_QUEUE_SIZE", raising=False)
        assert config.QUEUE_SIZE.resolve() == config.QUEUE_SIZE.default

    def test_environment_then_argument(self, monkeypatch):
        """The variable overrides the default; an explicit argument overrides both."""
        monkeypatch.setenv("OTEL_ROLLOUT_QUEUE_SIZE", "123")
        assert config.QUEUE_SIZE.resolve() == 123
        assert config.QUEUE_SIZE.resolve(7) == 7

    @pytest.mark.parametrize("raw", ["lots", "-5", "0"])
    def test_malformed_environment_falls_back_with_a_warning(self, monkeypatch, caplog, raw):
        """A bad value in a job script never kills the run: warn and use the default."""
        monkeypatch.setenv("OTEL_ROLLOUT_QUEUE_SIZE", raw)
        assert config.QUEUE_SIZE.resolve() == config.QUEUE_SIZE.default
        assert "OTEL_ROLLOUT_QUEUE_SIZE" in caplog.text

    @pytest.mark.parametrize(
        "setting, raw, words",
        [(config.QUEUE_SIZE, "lots", "expected a whole number"),
         (config.CLOSE_TIMEOUT, "soon", "expected a number of seconds"),
         (config.FSYNC_INTERVAL, "soon", "expected a number of seconds, or off")],
    )  # fmt: skip
    def test_a_value_that_does_not_parse_is_said_in_words(
        self, monkeypatch, caplog, setting, raw, words
    ):
        """A value that is no number says what was expected, not Python's ``invalid literal
        for int()`` or ``could not convert string to float``."""
        monkeypatch.setenv(setting.env, raw)
        monkeypatch.setattr(config, "_WARNED", set())
        assert setting.resolve() == setting.default
        assert f"ignoring {setting.env}={raw!r} ({words}); using" in caplog.text
        assert "literal" not in caplog.text and "convert" not in caplog.text

    def test_bad_explicit_value_is_an_error(self):
        """A program that passes an impossible value hears about it at once."""
        with pytest.raises(ValueError, match="must be positive"):
            config.QUEUE_SIZE.resolve(0)

    def test_every_setting_is_an_otel_rollout_variable(self):
        """All knobs live under the OTEL_ROLLOUT_ prefix and are listed in SETTINGS."""
        assert all(s.env.startswith("OTEL_ROLLOUT_") for s in config.SETTINGS)
        assert len({s.env for s in config.SETTINGS}) == len(config.SETTINGS)

    @pytest.mark.parametrize(("raw", "value"), [("false", False), ("0", False), ("Yes", True)])
    def test_flags_read_the_usual_spellings(self, monkeypatch, raw, value):
        """A true/false knob takes true/false, 1/0, yes/no, on/off, in any case."""
        monkeypatch.setenv("OTEL_ROLLOUT_HANDLE_SIGTERM", raw)
        assert config.HANDLE_SIGTERM.resolve() is value

    def test_a_misspelt_flag_keeps_the_default(self, monkeypatch, caplog):
        """A flag that is neither true nor false warns and keeps the default (on)."""
        monkeypatch.setenv("OTEL_ROLLOUT_HANDLE_SIGTERM", "maybe")
        assert config.HANDLE_SIGTERM.resolve() is True
        assert "OTEL_ROLLOUT_HANDLE_SIGTERM" in caplog.text

    def test_every_setting_is_in_the_readme(self):
        """The README's configuration table lists every knob with its default."""
        readme = (Path(__file__).parent.parent / "README.md").read_text()
        for setting in config.SETTINGS:
            assert f"| `{setting.env}` |" in readme, setting.env


class TestFsyncInterval:
    @pytest.mark.parametrize(
        ("raw", "value"), [("1", 1.0), ("0", 0.0), ("0.25", 0.25), ("off", math.inf)]
    )
    def test_seconds_zero_or_off(self, monkeypatch, raw, value):
        """The sync interval takes seconds, 0 (every batch) or off (never on its own)."""
        monkeypatch.setenv("OTEL_ROLLOUT_FSYNC_INTERVAL", raw)
        assert config.FSYNC_INTERVAL.resolve() == value

    @pytest.mark.parametrize("raw", ["-1", "nan", "soon"])
    def test_nonsense_keeps_the_default(self, monkeypatch, caplog, raw):
        """A negative, NaN or unreadable interval warns and keeps the default of 1 s."""
        monkeypatch.setenv("OTEL_ROLLOUT_FSYNC_INTERVAL", raw)
        assert config.FSYNC_INTERVAL.resolve() == 1.0
        assert "OTEL_ROLLOUT_FSYNC_INTERVAL" in caplog.text


class TestWatchInterval:
    @pytest.mark.parametrize("raw", ["1e-9", "0.01", "inf", "nan", "off"])
    def test_under_the_floor_or_no_number_keeps_the_default(self, monkeypatch, caplog, raw):
        """A refresh period under 0.05 s (a busy redraw loop), infinite or NaN warns and
        keeps the default of 0.5 s."""
        monkeypatch.setenv("OTEL_ROLLOUT_WATCH_INTERVAL", raw)
        assert config.WATCH_INTERVAL.resolve() == 0.5
        assert "OTEL_ROLLOUT_WATCH_INTERVAL" in caplog.text

    def test_the_floor_itself_is_taken(self, monkeypatch):
        """0.05 s is the shortest refresh period."""
        monkeypatch.setenv("OTEL_ROLLOUT_WATCH_INTERVAL", "0.05")
        assert config.WATCH_INTERVAL.resolve() == 0.05


_SECONDS = [s for s in config.SETTINGS if isinstance(s.default, float)]


class TestNoNumberIsNoSetting:
    @pytest.mark.parametrize("setting", _SECONDS, ids=lambda s: s.env)
    @pytest.mark.parametrize("raw", ["nan", "-nan", "NaN"])
    def test_nan_from_the_environment_keeps_the_default(self, monkeypatch, caplog, setting, raw):
        """NaN is no number of seconds for any knob: it warns and keeps the default."""
        monkeypatch.setenv(setting.env, raw)
        assert setting.resolve() == setting.default
        assert setting.env in caplog.text

    @pytest.mark.parametrize(
        "setting", [s for s in _SECONDS if s is not config.FSYNC_INTERVAL], ids=lambda s: s.env
    )
    def test_infinity_keeps_the_default_where_it_means_nothing(self, monkeypatch, setting):
        """Only the sync interval takes infinity (never on its own); elsewhere it is refused."""
        monkeypatch.setenv(setting.env, "inf")
        assert setting.resolve() == setting.default

    def test_nan_in_code_is_refused(self):
        """A NaN handed in by a program is an error, not a silent no-op."""
        with pytest.raises(ValueError, match="must be a number"):
            config.CLOSE_TIMEOUT.resolve(math.nan)

    @pytest.mark.parametrize("setting", _SECONDS, ids=lambda s: s.env)
    def test_a_wait_longer_than_python_waits_keeps_the_default(self, monkeypatch, setting):
        """1e300 seconds is finite, but no wait Python makes: it is refused with its bound."""
        monkeypatch.setenv(setting.env, "1e300")
        assert setting.resolve() == setting.default
        with pytest.raises(ValueError, match="must be at most 1e\\+09 seconds"):
            setting.resolve(1e300)

    @pytest.mark.parametrize("raw", ["nan", "inf", "1e300"])
    def test_a_trace_closes_with_a_close_timeout_of_no_number(self, monkeypatch, tmp_path, raw):
        """close() under OTEL_ROLLOUT_CLOSE_TIMEOUT=nan, inf or 1e300 writes every event and
        returns (it raised ValueError or OverflowError from the thread join)."""
        from otel_rollout import RolloutTrace

        monkeypatch.setenv("OTEL_ROLLOUT_CLOSE_TIMEOUT", raw)
        trace = RolloutTrace(tmp_path)
        trace.emit("group.admit", group_id="g", prompt_id=1)
        trace.close()
        lines = (tmp_path / "rollout_trace.jsonl").read_text().splitlines()
        assert [line.split('"event":"')[1].split('"')[0] for line in lines] == [
            "run.start",
            "group.admit",
        ]

"""Progress bars only on a terminal: piped into a log, tqdm's carriage returns and transformers'
"Loading weights" bars filled non-terminal logs with escape codes."""

from __future__ import annotations

import argparse

import pytest
import transformers
import transformers.utils.logging as hf_logging
from huggingface_hub.utils import are_progress_bars_disabled, enable_progress_bars

from ropescale.cli import main as cli_main
from tests.conftest import tiny_model


@pytest.fixture
def restore_bars(monkeypatch):
    """Bars on before (an earlier in-process main() may have turned them off) and after the test."""
    monkeypatch.delenv("HF_HUB_DISABLE_PROGRESS_BARS", raising=False)  # restored after the test
    enable_progress_bars()
    hf_logging.enable_progress_bar()
    yield
    enable_progress_bars()
    hf_logging.enable_progress_bar()


def test_on_a_terminal_nothing_changes(restore_bars):
    args = argparse.Namespace(no_progress=False)
    cli_main.progress_only_on_a_terminal(args, terminal=True)
    assert args.no_progress is False and hf_logging.is_progress_bar_enabled() and not are_progress_bars_disabled()


def test_off_a_terminal_every_bar_is_off(restore_bars, tmp_path, capfd):
    tiny_model().save_pretrained(tmp_path / "m")
    args = argparse.Namespace(no_progress=False)
    cli_main.progress_only_on_a_terminal(args, terminal=False)
    assert args.no_progress is True  # ropescale's own bars: the command's --no-progress
    assert not hf_logging.is_progress_bar_enabled() and are_progress_bars_disabled()
    capfd.readouterr()
    transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "m")
    assert "Loading weights" not in capfd.readouterr().err
    argparse_without_the_flag = argparse.Namespace()
    cli_main.progress_only_on_a_terminal(argparse_without_the_flag, terminal=False)  # patch, doctor: no flag
    assert not hasattr(argparse_without_the_flag, "no_progress")


def test_main_decides_from_stderr(restore_bars, monkeypatch, tmp_path):
    """pytest's stderr is not a terminal: a command run through main() gets no bars."""
    seen = {}

    def fake_job(options, output, overwrite=False, progress=True):
        seen["progress"] = progress
        return None

    monkeypatch.setattr("ropescale.search.run_search_job", fake_job)
    cli_main.main(["search", "--target-length", "32768", "--output", str(tmp_path / "s")])  # its exit: not at issue
    assert seen == {"progress": False}

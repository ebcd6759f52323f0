"""``ropescale`` command line: sub-commands as :class:`~.command.Command` values, errors as one line.

Every error a user can cause is printed as ``ropescale: error: <one line>`` on stderr with exit
status 2 (1 for unexpected failures); set ``ROPESCALE_DEBUG=1`` to see the traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path

from ropescale.cli import config_path as config_path_cmd
from ropescale.cli import data as data_cmd
from ropescale.cli import doctor as doctor_cmd
from ropescale.cli import eval as eval_cmd
from ropescale.cli import export_gguf as export_gguf_cmd
from ropescale.cli import methods as methods_cmd
from ropescale.cli import patch as patch_cmd
from ropescale.cli import plot as plot_cmd
from ropescale.cli import recommend as recommend_cmd
from ropescale.cli import search as search_cmd
from ropescale.cli import train as train_cmd
from ropescale.cli.command import Command
from ropescale.models.runtime import keep_freed_memory

EXIT_USAGE = 2
EXIT_FAILURE = 1
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE


class OneLineParser(argparse.ArgumentParser):
    """argparse that reports a usage error as one line instead of usage + message."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{self.prog}: {message} (see --help)")

    def _print_message(self, message: str, file=None) -> None:  # type: ignore[override]
        """argparse's own swallows write errors: ``--help | head -c0`` would exit 0 with nothing written."""
        if message:
            (file or sys.stderr).write(message)


class UsageError(Exception):
    pass


#: every sub-command, in the order ``ropescale --help`` lists them (groups install their own)
COMMANDS: tuple[Command, ...] = (
    methods_cmd.COMMAND,
    patch_cmd.COMMAND,
    eval_cmd.COMMAND,
    plot_cmd.COMMAND,
    recommend_cmd.COMMAND,
    search_cmd.COMMAND,
    train_cmd.TRAIN,
    train_cmd.EXPORT,
    data_cmd.COMMAND,
    export_gguf_cmd.COMMAND,
    config_path_cmd.COMMAND,
    doctor_cmd.COMMAND,
)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="ropescale",
        description="Extend the context window of pretrained RoPE LLMs (Llama, Mistral, Qwen2/3).",
    )
    from ropescale import __version__

    parser.add_argument("--version", action="version", version=f"ropescale {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineParser)
    sub.required = True
    for command in COMMANDS:
        command.install(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status (also used in-process by the tests).

    A closed standard output (``ropescale methods | head -1``, a reader that died) is not success:
    the output is flushed here, where a ``BrokenPipeError`` can still be caught, and the status is
    141 (128 + SIGPIPE, what a shell reports for a process a broken pipe killed), with standard
    output pointed at ``os.devnull`` so the flush at interpreter exit cannot fail again (the recipe
    of the Python documentation, ``signal`` module, "Note on SIGPIPE").
    """
    try:
        code = _run(argv)
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        return _broken_pipe()
    except SystemExit:  # --help, --version: argparse printed and exits
        try:
            sys.stdout.flush()
        except BrokenPipeError:
            return _broken_pipe()
        raise


def _broken_pipe() -> int:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # not a real file (captured in tests)
        pass
    return EXIT_BROKEN_PIPE


def _one_line_warning(message, category, filename, lineno, line=None, _default=warnings.formatwarning) -> str:
    """ropescale's own warnings as one line, ``ropescale: warning: ...`` (Python's default adds the file,
    line and source line); other libraries' keep Python's format, so they are not taken for ours."""
    if Path(filename).resolve().is_relative_to(_PACKAGE_ROOT):
        return f"ropescale: warning: {' '.join(str(message).split())}\n"
    return _default(message, category, filename, lineno, line)


_PACKAGE_ROOT = Path(__file__).resolve().parents[1]  # the checkout (cli/ beside ropescale/) or site-packages


def _run(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    default, warnings.formatwarning = warnings.formatwarning, _one_line_warning
    try:
        args = parser.parse_args(argv)
        progress_only_on_a_terminal(args)
        keep_freed_memory()  # a quarter of a CPU training step went to mapping freed memory again
        return int(args.func(args) or 0)
    except UsageError as exc:
        print(f"ropescale: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:  # output piped into head & co.: main reports it
        raise
    except KeyboardInterrupt:
        print("ropescale: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - the CLI's promise is one line, never a traceback
        if os.environ.get("ROPESCALE_DEBUG"):
            raise
        return report(exc)
    finally:
        warnings.formatwarning = default


def progress_only_on_a_terminal(args: argparse.Namespace, terminal: bool | None = None) -> None:
    """Progress bars only when stderr is a terminal: in a log file or a pipe tqdm's carriage returns
    and escape codes become thousands of lines. The one place where this is decided, for ropescale's
    own bars (a command's ``--no-progress``) and for transformers' ("Loading weights") and
    huggingface_hub's, which their own switches turn off. Results and ``metrics.jsonl`` record the
    same progress in plain lines."""
    if sys.stderr.isatty() if terminal is None else terminal:
        return
    if hasattr(args, "no_progress"):
        args.no_progress = True
    # huggingface_hub reads this when imported and transformers' bars follow the hub's switch; when
    # they are imported already (in process), their own switches
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    if "huggingface_hub" in sys.modules:
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()
    if "transformers.utils.logging" in sys.modules:
        sys.modules["transformers.utils.logging"].disable_progress_bar()


def report(exc: Exception) -> int:
    from ropescale.errors import RopescaleError

    message = " ".join(str(exc).split()) or type(exc).__name__
    expected = isinstance(exc, (RopescaleError, ValueError, FileExistsError, PermissionError, FileNotFoundError))
    prefix = "" if expected else f"{type(exc).__name__}: "
    print(f"ropescale: error: {prefix}{message}", file=sys.stderr)
    return EXIT_USAGE if expected else EXIT_FAILURE


if __name__ == "__main__":
    sys.exit(main())

"""`pardiag` command line: one module per subcommand, one registry, `main(argv) -> int`."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from typing import Callable, Sequence

from pardiag import __version__
from pardiag.errors import UserError
from pardiag.rundir import RunDirError

# name -> (module under pardiag.commands, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("run", "run a training command under the profiler and NCCL logging"),
    "analyze": ("analyze", "where each rank's time goes, waiting vs transfer, stragglers"),
    "scaling": ("scaling", "scaling efficiency across runs at different world sizes, Amdahl fit"),
    "demo": ("demo", "run the bundled example job on this machine (CPU, 2 ranks) end to end"),
    "merge": ("merge", "join per-node run directories into one"),
    "report": ("report", "render an HTML report, a markdown PR comment or the JSON of a run"),
    "tui": ("tui", "explore a run in the terminal: ranks, collectives, timeline, NCCL setup, findings"),
    "diff": ("diff", "compare two runs: step-time change with a significance test; exit 1 on a regression"),
    "export": ("export", "one Chrome/Perfetto trace of all ranks: clocks aligned, collectives joined, critical path"),
}

EPILOG = """examples:
  pardiag run -- torchrun --nproc-per-node 8 train.py
  pardiag run --out runs/exp1 --profile-steps 10,2,3 -- python -m torch.distributed.run ...
  srun pardiag run --out /shared/runs/exp1 -- python train.py
  pardiag demo
"""


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, Callable[[argparse.Namespace], int]]]:
    parser = argparse.ArgumentParser(
        prog="pardiag",
        description="Explains why a distributed PyTorch training job does not scale.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"pardiag {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    handlers: dict[str, Callable[[argparse.Namespace], int]] = {}
    for name, (module, help_text) in COMMANDS.items():
        mod = importlib.import_module(f"pardiag.commands.{module}")
        p = sub.add_parser(
            name,
            help=help_text,
            description=getattr(mod, "DESCRIPTION", help_text),
            epilog=getattr(mod, "EPILOG", None),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        mod.add_arguments(p)
        handlers[name] = mod.execute
    return parser, handlers


# What a command killed by SIGPIPE reports to the shell (128 + 13), as `cat`, `grep` or `git
# log` do when the reader of their output goes away (`pardiag analyze RUN | head -1`): a
# `set -o pipefail` script sees the same as for them, and never a success for output that
# was cut short.
EXIT_BROKEN_PIPE = 141


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command. A closed stdout ends it quietly, with no traceback."""
    try:
        try:
            return _main(argv)
        finally:
            if sys.stdout is not None:
                sys.stdout.flush()  # a closed pipe shows up here, not in the interpreter's exit
    except BrokenPipeError:
        _stdout_to_devnull()
        return EXIT_BROKEN_PIPE
    except SystemExit as e:
        if _rich_closed_pipe(e):
            return EXIT_BROKEN_PIPE
        raise


def _rich_closed_pipe(e: SystemExit) -> bool:
    """Whether rich ended the command on a closed stdout: its `Console.on_broken_pipe`
    (in the rich versions that have it) points stdout at /dev/null itself and raises SystemExit(1)."""
    console = sys.modules.get("rich.console")
    hook = getattr(getattr(console, "Console", None), "on_broken_pipe", None)
    tb = e.__traceback__
    if hook is None or tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    return tb.tb_frame.f_code is getattr(hook, "__code__", None)


def _stdout_to_devnull() -> None:
    """Point stdout at /dev/null, so that what is still buffered is dropped at exit
    instead of failing again (the pattern of Python's `signal` documentation)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # stdout is no file (replaced, or already closed)
        pass


def _main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser, handlers = build_parser()
    args, extra = _split_command(parser, argv)
    if args.command is None:
        parser.print_help()
        return 2
    if extra is not None:
        args.cmd = extra
    logging.basicConfig(level=logging.DEBUG if args.debug else logging.WARNING, format="pardiag: %(message)s")
    try:
        return handlers[args.command](args)
    except (UserError, RunDirError) as e:
        if args.debug:
            raise
        print(f"pardiag: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("pardiag: interrupted", file=sys.stderr)
        return 130


def _split_command(
    parser: argparse.ArgumentParser, argv: list[str]
) -> tuple[argparse.Namespace, list[str] | None]:
    """Everything after the first `--` is the wrapped command, untouched by argparse."""
    if "--" in argv:
        i = argv.index("--")
        args = parser.parse_args(argv[:i])
        return args, argv[i + 1 :]
    return parser.parse_args(argv), None

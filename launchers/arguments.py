"""What tbrun's command line is made of, on the standard library's argparse: value types whose
errors name the value and what was expected, TBRUN_<NAME> variables as flags, and a parser
that raises UsageError instead of printing its usage and exiting.

argparse, not click: importing click (inspect, typing, uuid, datetime ...) cost tbrun ~12 ms of
CPU before its first rank started, argparse ~2 (benchmarks/RESULTS.md).
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable, Iterable, Mapping, Sequence

ENV_PREFIX = "TBRUN_"
_TRUE = ("1", "true", "t", "yes", "y", "on")
_FALSE = ("0", "false", "f", "no", "n", "off", "")


class UsageError(Exception):
    """A command line that cannot run: one line, exit status 2."""


class Parser(argparse.ArgumentParser):
    """argparse's parser without abbreviated flags, raising UsageError on bad input."""

    def __init__(self, usage: str, description: str, epilog: str | None = None) -> None:
        # argparse makes a formatter at each add_argument (to check its metavar), and one
        # left to find the terminal's width imports shutil (~2 ms of tbrun's start-up):
        # the width is the terminal's only for --help (format_help)
        super().__init__(usage=usage, description=description, epilog=epilog, add_help=False,
                         allow_abbrev=False, formatter_class=_unmeasured_formatter)
        self.flags: list[argparse.Action] = []  # what TBRUN_<NAME> variables may set
        self.add_argument("-h", "--help", action="help", help="Show this message and exit.")

    def format_help(self) -> str:
        self.formatter_class = argparse.RawDescriptionHelpFormatter
        return super().format_help()

    def add_argument(self, *names: str, **options: object) -> argparse.Action:
        action = super().add_argument(*names, **options)
        if action.option_strings and action.dest != argparse.SUPPRESS:  # not --help
            self.flags.append(action)
        return action

    def error(self, message: str) -> None:  # argparse's hook: it would print and exit
        raise UsageError(message)

    def parse(self, argv: Sequence[str], environ: Mapping[str, str]) -> argparse.Namespace:
        """The flags of argv, else their TBRUN_<NAME> variable, else their default; the words
        of a repeatable flag's variable (TBRUN_EXPORTS) come before what argv adds."""
        given, unknown = self.parse_known_args(argv, argparse.Namespace(**from_environment(
            self.flags, environ)))
        if unknown:
            raise UsageError(f"No such option {unknown[0]!r}")
        return given


def _unmeasured_formatter(prog: str) -> argparse.HelpFormatter:
    return argparse.RawDescriptionHelpFormatter(prog, width=80)


def from_environment(actions: Iterable[argparse.Action],
                     environ: Mapping[str, str]) -> dict[str, object]:
    """The value of each option set as TBRUN_<DEST> in environ, converted as the flag's."""
    values: dict[str, object] = {}
    for action in actions:
        name = ENV_PREFIX + action.dest.upper()
        if name not in environ:
            continue
        text = environ[name]
        try:
            if action.nargs == 0:  # a flag
                values[action.dest] = boolean(text)
            elif isinstance(action.default, list):  # repeatable (-x): the variable's words
                values[action.dest] = [_convert(action, word) for word in text.split()]
            else:
                values[action.dest] = _convert(action, text)
        except argparse.ArgumentTypeError as e:
            raise UsageError(f"{name}={text!r}: {e}") from None
    return values


def _convert(action: argparse.Action, text: str) -> object:
    return action.type(text) if callable(action.type) else text


def boolean(text: str) -> bool:
    """A flag's TBRUN_ variable: 1/true/yes/on or 0/false/no/off."""
    word = text.strip().lower()
    if word in _TRUE or word in _FALSE:
        return word in _TRUE
    raise argparse.ArgumentTypeError(f"{text!r} is not a valid boolean (1/0, true/false, "
                                     "yes/no, on/off)")


def whole(low: int, high: int | None = None) -> Callable[[str], int]:
    """A whole number from low to high."""
    def convert(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a valid integer") from None
        if value < low or (high is not None and value > high):
            bounds = f"{low}<=x<={high}" if high is not None else f"x>={low}"  # as click wrote
            raise argparse.ArgumentTypeError(f"{value} is not in the range {bounds}")
        return value
    return convert


def seconds(low: float, open_low: bool = False) -> Callable[[str], float]:
    """A finite number of seconds, at least low (above it with open_low)."""
    def convert(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite number of seconds")
        if value < low or (open_low and value == low):
            bound = f"x>{low:g}" if open_low else f"x>={low:g}"
            raise argparse.ArgumentTypeError(f"{value:g} is not in the range {bound}")
        return value
    return convert


def choice(options: Sequence[str]) -> Callable[[str], str]:
    """One of options (argparse's own choices= words its error otherwise)."""
    def convert(text: str) -> str:
        if text not in options:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not one of {', '.join(map(repr, options))}")
        return text
    return convert


def one_of(options: Sequence[str]) -> str:
    """How --help shows the choices: {a,b,c}."""
    return "{" + ",".join(options) + "}"


def directory(text: str) -> str:
    """A folder's path: it may not exist yet, but may not be a file."""
    if os.path.isfile(text):
        raise argparse.ArgumentTypeError(f"directory {text!r} is a file")
    return text


def file(text: str) -> str:
    """A file's path: it may not exist yet, but may not be a folder."""
    if os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"file {text!r} is a directory")
    return text

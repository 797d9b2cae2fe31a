"""The CLI's argument parser (argparse's, with a "did you mean" for a mistyped option), and
messages whose hints are written in the command line's syntax."""

from __future__ import annotations

import argparse
import difflib
import re
from typing import Any, NoReturn


def cli_syntax(message: str) -> str:
    """``message`` with its hints in the command line's syntax: a producer keyword written as
    ``create_stream=True`` reads ``-o create_stream=true``."""
    return re.sub(
        r"\b([a-z_]+)=(True|False)\b",
        lambda match: f"-o {match[1]}={match[2].lower()}",
        message,
    )


class HelpFormatter(argparse.HelpFormatter):
    """argparse's, but a description or epilog written in several lines (examples) is kept as
    written; one written as a single line is wrapped to the terminal as usual."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if "\n" in text.strip():
            return "".join(indent + line for line in text.splitlines(keepends=True))
        return super()._fill_text(text, width, indent)


def help_pointer(prog: str) -> str:
    """The line under an error: where the options and examples are."""
    return f"Run '{prog} --help' for its options and examples."


class ArgumentParser(argparse.ArgumentParser):
    """An ``argparse.ArgumentParser`` whose errors are the error and one line pointing at
    ``--help`` (argparse's own print the whole usage first: ~20 lines for ``produce``, above
    the one that matters), and whose error for unrecognized arguments names, for each mistyped
    option, the closest one it knows (``--one-by-on``: did you mean ``--one-by-one``?).
    Examples in a parser's ``epilog`` keep their lines (:class:`HelpFormatter`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        prefix = "unrecognized arguments: "
        if message.startswith(prefix):
            hints = [self._suggestion(word) for word in message[len(prefix) :].split()]
            found = [hint for hint in hints if hint]
            if found:
                message += " (" + "; ".join(found) + ")"
        self.exit(2, f"{self.prog}: error: {message}\n{help_pointer(self.prog)}\n")

    def _suggestion(self, word: str) -> str | None:
        if not word.startswith("-"):
            return None
        name = word.split("=", 1)[0]
        known = [
            option
            for action in self._actions
            if action.help != argparse.SUPPRESS
            for option in action.option_strings
        ]
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
        return f"{name}: did you mean {close[0]}?" if close else None

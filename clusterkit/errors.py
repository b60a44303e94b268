"""Errors about user input, each pointing at a file, a line and a key path."""

from __future__ import annotations

from dataclasses import dataclass


def printable(text: str) -> str:
    """One line of inert text: line breaks, escape sequences (ESC, BEL) and every other control or
    separator character from a recipe are shown escaped (``\\n``, ``\\x1b``), never sent to the
    terminal or log as they are."""
    return "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in text)


@dataclass(frozen=True)
class Location:
    """Where a value came from: a file and line, or a command-line override."""

    file: str
    line: int | None = None

    def __str__(self) -> str:
        return f"{self.file}:{self.line}" if self.line else self.file


def format_key_path(path: tuple[str | int, ...]) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "<top level>"


@dataclass(frozen=True)
class Finding:
    """One problem found in a recipe. ``severity`` is "error" or "warning"."""

    location: Location
    key_path: tuple[str | int, ...]
    message: str
    severity: str = "error"

    def __str__(self) -> str:
        prefix = "" if self.severity == "error" else "warning: "
        return printable(f"{self.location}: {prefix}{format_key_path(self.key_path)}: {self.message}")


class RecipeError(Exception):
    """Bad user input. The CLI prints ``str(error)`` (one line) and exits with code 2."""

    def __init__(self, finding: Finding):
        super().__init__(str(finding))
        self.finding = finding


class RecipeErrors(RecipeError):
    """Several independent problems in one recipe, reported together (one line each)."""

    def __init__(self, findings: list[Finding]):
        Exception.__init__(self, "\n".join(str(f) for f in findings))
        self.finding = findings[0]
        self.findings = findings

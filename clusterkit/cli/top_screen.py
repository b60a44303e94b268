"""``clusterkit top`` on a terminal: the table full-screen (rich's alternate screen), refreshed every
interval, with keys read in between: arrows (or j/k) move the selection, ``l`` leaves and prints how
to read the selected run's logs, ``c`` cancels it after a y/N question, ``q`` quits. The terminal's
mode is restored whatever ends the view, Ctrl-C included (the command then exits 130)."""

from __future__ import annotations

import os
import select
import sys
import termios
import time
import tty
from dataclasses import dataclass

QUIT, LOGS, CANCEL = "quit", "logs", "cancel"
UP, DOWN = (b"\x1b[A", b"\x1bOA", b"k"), (b"\x1b[B", b"\x1bOB", b"j")


@dataclass
class View:
    """What the keys change: the selected row, a pending cancel question, the last message."""

    selected: int = 0
    confirming: bool = False
    message: str = ""

    def on_key(self, key: bytes, rows: int) -> str | None:
        """The action a key asks for (QUIT, LOGS, CANCEL) or None; moves the selection."""
        if self.confirming:
            self.confirming = False
            if key in (b"y", b"Y"):
                return CANCEL
            self.message = "not cancelled"
            return None
        self.message = ""
        if key in (b"q", b"Q"):
            return QUIT
        if key in UP:
            self.selected = max(0, self.selected - 1)
        elif key in DOWN:
            self.selected = min(rows - 1, self.selected + 1)
        elif key == b"l" and rows:
            return LOGS
        elif key == b"c" and rows:
            self.confirming = True
        return None


def _render(rows: list, view: View, interval: float):
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    from clusterkit.errors import printable
    from clusterkit.runs.top import HEADER, cells

    table = Table(*HEADER, box=None, header_style="bold", expand=True)
    for index, row in enumerate(rows):  # Text, never markup: every cell is inert already (runs.top)
        style = "reverse" if index == view.selected else ("red" if row.flags else "")
        table.add_row(*map(Text, cells(row)), style=style)
    if view.confirming:
        row = rows[view.selected]
        footer = Text(printable(f"cancel job {row.job_id} ({row.name})? [y/N]"), style="bold red")
    else:
        footer = Text(view.message or f"every {interval:g} s   ↑/↓ select   l logs   c cancel   q quit", style="dim")
    return Group(table, footer)


def _key(fd: int, timeout: float) -> bytes | None:
    """A key pressed within ``timeout`` seconds (an arrow's escape sequence whole), or None."""
    ready, _, _ = select.select([fd], [], [], max(0.0, timeout))
    return os.read(fd, 16) if ready else None


def show(watch, rows: list, interval: float) -> int:
    """Until q (or l): the table, refreshed every ``interval`` seconds."""
    from rich.console import Console
    from rich.live import Live

    from clusterkit.errors import printable

    view = View()
    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    leaving_for = None
    try:
        tty.setcbreak(fd)  # keys one by one, unechoed; Ctrl-C still interrupts
        with Live(console=Console(), screen=True, auto_refresh=False) as live:
            next_at = time.monotonic() + interval
            while True:
                view.selected = min(view.selected, len(rows) - 1)
                live.update(_render(rows, view, interval), refresh=True)
                key = _key(fd, next_at - time.monotonic())
                if key is None:
                    rows, next_at = watch.refresh(), time.monotonic() + interval
                    continue
                action = view.on_key(key, len(rows))
                if action == QUIT:
                    break
                if action == LOGS:
                    leaving_for = rows[view.selected]
                    break
                if action == CANCEL:
                    view.message = watch.cancel(view.selected)
                    rows = watch.refresh()
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)
    if leaving_for is not None:
        print(printable(f"logs of job {leaving_for.job_id}: clusterkit logs {leaving_for.job_id} -f"))
        print(printable(f"run dir: {leaving_for.run_dir}"))
    return 0

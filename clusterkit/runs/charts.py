"""Training curves drawn: a PNG with matplotlib (the ``[bench]`` extra) and a text chart for a
terminal with plotext (the same extra). One panel per quantity, one line per run, labelled as
:mod:`clusterkit.runs.curves` labels it. Both libraries are imported here only, when called."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

from clusterkit.errors import MissingPackage
from clusterkit.runs.curves import QUANTITIES, Curves

if TYPE_CHECKING:
    from matplotlib.figure import Figure

EXTRA_HINT = "pip install 'clusterkit[bench]'"
TERMINAL_PANEL_ROWS = 15
# One marker per run, so the lines tell apart without colour too (a pipe, a log file).
TERMINAL_MARKERS = ("hd", "x", "o", "+", "*", "#", "@", "%")


def panels(curves: list[Curves]) -> list[str]:
    """The quantities some run logged, in QUANTITIES' order."""
    return [quantity for quantity in QUANTITIES if any(quantity in c.series for c in curves)]


def has_matplotlib() -> bool:
    import importlib

    try:
        importlib.import_module("matplotlib")  # imported, not only found: a broken install counts as none
    except ImportError:
        return False
    return True


def figure(curves: list[Curves]) -> Figure:
    """The chart as a matplotlib Figure (no pyplot: no global state, no GUI backend)."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    shown = panels(curves)
    chart = Figure(figsize=(9, 2.8 * len(shown)), layout="constrained")
    for axes, quantity in zip(chart.subplots(len(shown), 1, sharex=True, squeeze=False)[:, 0], shown):
        for run in curves:
            if quantity in run.series:
                series = run.series[quantity]
                axes.plot(series.steps, series.values, marker="." if len(series.steps) < 50 else None, label=run.label)
        axes.set(ylabel=QUANTITIES[quantity], title=QUANTITIES[quantity])
        axes.grid(alpha=0.3)
        axes.legend(fontsize="small")
    chart.axes[-1].set_xlabel("step")
    chart.axes[-1].xaxis.set_major_locator(MaxNLocator(integer=True))
    return chart


def write_png(curves: list[Curves], path: Path) -> None:
    figure(curves).savefig(path, dpi=100)


def step_ticks(curves: list[Curves], most: int = 6) -> list[int]:
    """Whole-number steps for the text chart's x axis (plotext would label 1.75)."""
    steps = [step for run in curves for series in run.series.values() for step in series.steps]
    stride = max(1, math.ceil((max(steps) - min(steps)) / most))
    return list(range(min(steps), max(steps) + 1, stride))


def terminal_chart(curves: list[Curves], width: int, colour: bool = False) -> str:
    """The chart as text for a terminal ``width`` wide: box-drawing characters, and colour codes
    only with ``colour``."""
    try:
        import plotext as plt
    except ImportError:
        raise MissingPackage(f"drawing in the terminal needs plotext: {EXTRA_HINT}") from None

    shown, ticks = panels(curves), step_ticks(curves)
    plt.clf()
    plt.theme("default" if colour else "clear")
    plt.limitsize(False, False)  # the chart may be taller than the window: it scrolls, each panel stays readable
    plt.plotsize(width, TERMINAL_PANEL_ROWS * len(shown))
    plt.subplots(len(shown), 1)
    for row, quantity in enumerate(shown, 1):
        plt.subplot(row, 1)
        for number, run in enumerate(curves):
            if quantity in run.series:
                plt.plot(
                    run.series[quantity].steps,
                    run.series[quantity].values,
                    label=run.label,
                    marker=TERMINAL_MARKERS[number % len(TERMINAL_MARKERS)],
                )
        plt.title(QUANTITIES[quantity])
        plt.xlabel("step")
        plt.xticks(ticks)
    text = plt.build() if colour else plt.uncolorize(plt.build())
    plt.clf()
    return "\n".join(line.rstrip() for line in text.splitlines())

"""``clusterkit render -o DIR``: the rendered files as an output folder (:mod:`clusterkit.runs.output_dir`:
a new or empty folder is filled, an earlier render replaced whole, anything else refused)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from clusterkit.runs.output_dir import write_output
from clusterkit.spec.layout import RENDER_MARKER as MARKER

__all__ = ["MARKER", "write_render"]


def write_render(files: Mapping[str, str], out_dir: Path, description: str) -> Path:
    """Write ``files`` (name → text) into ``out_dir``, all or none; returns the directory written."""

    def fill(folder: Path) -> None:
        for name, text in files.items():
            _write_file(folder / name, text)

    return write_output(out_dir, "render", description, fill)


def _write_file(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)  # <index>/ (a sweep point), supervisor/
    path.write_text(text, encoding="utf-8")
    path.chmod(0o755 if path.name.endswith(".sbatch") else 0o644)

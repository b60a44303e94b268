"""A sweep rendered: each point's own job files under ``<index>/`` (a pure render of that point's
resolved recipe) and the array's driver, ``sweep.sbatch``, which runs task i's point. One job array
is one allocation shape, so every point must ask for the same ``#SBATCH`` lines."""

from __future__ import annotations

import json

from clusterkit.errors import Finding, RecipeError
from clusterkit.load.sweep import SweepPoints
from clusterkit.render.job import RenderedJob, jinja_environment, render_job, sbatch_options, template_search_path
from clusterkit.render.template_files import checked_script, render_template
from clusterkit.spec import layout as run_layout
from clusterkit.version import __version__

SWEEP_TEMPLATE = "sweep.sbatch.j2"


def _same_allocation(sweep: SweepPoints) -> list[tuple[str, object]]:
    first = sbatch_options(sweep.points[0])
    for point in sweep.points[1:]:
        header = sbatch_options(point)
        if header != first:
            differ = sorted(set(first) ^ set(header))
            flag = differ[0][0]
            keys = ", ".join(sweep.grid)
            raise RecipeError(
                Finding(
                    sweep.base.locate(("sweep",)),
                    ("sweep", "grid"),
                    (
                        f"point {point.recipe.array.point} asks for another allocation than point 0 (#SBATCH --{flag}); "  # type: ignore[union-attr]
                        f"one job array has one allocation shape: sweep {keys} in separate sweeps, one per allocation"
                    ),
                )
            )
    return first


def render_sweep(sweep: SweepPoints, template_dirs: tuple[str, ...] = ()) -> RenderedJob:
    header = _same_allocation(sweep)
    rendered = [render_job(point, template_dirs) for point in sweep.points]
    files = {f"{index}/{name}": text for index, job in enumerate(rendered) for name, text in job.files.items()}
    base = sweep.points[0]
    recipe = base.recipe
    points = [{"index": p.recipe.array.point, "values": p.recipe.array.values} for p in sweep.points]  # type: ignore[union-attr]
    files[run_layout.SWEEP_POINTS] = json.dumps({"grid": sweep.grid, "points": points}, indent=1) + "\n"
    context = {
        "version": __version__,
        "name": recipe.name,
        "recipe_file": str(sweep.base.path),
        "sbatch": header,
        "run_dir_base": f"{recipe.runs_dir}/{recipe.name}",
        "points": points,
        "layout": run_layout,
    }
    env = jinja_environment(template_search_path(base, template_dirs))
    files[run_layout.SWEEP_SCRIPT] = checked_script(env, SWEEP_TEMPLATE, render_template(env, SWEEP_TEMPLATE, context))
    summary = [
        ("sweep", f"{len(points)} points of {', '.join(sweep.grid)} as one array (--array={sweep.spec})"),
        *rendered[0].summary,
    ]
    return RenderedJob(
        name=recipe.name, files=dict(sorted(files.items())), summary=summary, script_name=run_layout.SWEEP_SCRIPT
    )

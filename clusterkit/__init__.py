"""clusterkit: from a YAML recipe to a running multi-node SLURM training job.

The public, importable surface (kept free of torch/transformers/deepspeed so that importing it is
fast on a login node)::

    from clusterkit import load_recipe, render_job
    loaded = load_recipe("recipes/tiny-cpu.yaml", overrides=["resources.nodes=2"])
    job = render_job(loaded)          # pure: files as text, nothing written
    job.files["job.sbatch"]
"""

__version__ = "0.1.0"

import gc

from clusterkit.errors import RecipeError, RecipeErrors
from clusterkit.loader import LoadedRecipe, load_recipe
from clusterkit.render import RenderedJob, render_job

# msgspec issue #717: collecting msgspec.Meta-constrained Struct types while the interpreter shuts
# down can segfault (here: about one exit in three once a recipe was converted). Freezing moves the
# types, now all defined, out of reach of the final collection; they live for the whole process anyway.
gc.freeze()

__all__ = [
    "LoadedRecipe",
    "RecipeError",
    "RecipeErrors",
    "RenderedJob",
    "__version__",
    "load_recipe",
    "render_job",
]

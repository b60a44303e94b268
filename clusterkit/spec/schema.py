"""JSON Schemas of the files a user writes (a recipe, a cluster profile), for editors
(``clusterkit schema``) and the docs' reference pages."""

from __future__ import annotations

from typing import Any

import msgspec

from clusterkit.spec.profile import ClusterProfile
from clusterkit.spec.recipe import Recipe


def file_json_schema(struct: type, title: str) -> dict[str, Any]:
    """JSON Schema (draft 2020-12) of a YAML file that decodes to ``struct``, for editors."""
    schema = msgspec.json.schema(struct)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = title
    return schema


def recipe_json_schema() -> dict[str, Any]:
    """JSON Schema of a recipe file, for editors (``clusterkit schema``)."""
    schema = file_json_schema(Recipe, "clusterkit recipe")
    # `extends` is resolved (and removed) before the struct is built, so it is not a Recipe field.
    recipe_def = schema["$defs"]["Recipe"]
    recipe_def["properties"]["extends"] = {
        "description": "base recipe path(s), relative to this file; deep-merged, later wins, this file wins",
        "anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}],
    }
    return schema


def profile_json_schema() -> dict[str, Any]:
    """JSON Schema of a cluster profile file, for editors (``clusterkit schema --profile``)."""
    return file_json_schema(ClusterProfile, "clusterkit cluster profile")

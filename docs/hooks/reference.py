"""MkDocs hook: the reference pages, generated at every build from the code itself, so they cannot
drift from it: the recipe and cluster profile from their JSON Schemas (`clusterkit schema
[--profile]`: fields, types, defaults, the structs' docstrings) with each field's comment in the
source as its description, and the command line from the real argparse parser."""

from __future__ import annotations

import argparse
import ast
import html
import inspect
import io
import json
import os
import textwrap
import tokenize
from typing import Any

import msgspec
from mkdocs.structure.files import File, Files

from clusterkit.cli.parser import build_parser
from clusterkit.spec.profile import ClusterProfile
from clusterkit.spec.recipe import (
    IDENTIFIER_PATTERN,
    KEY_PATH_PATTERN,
    NO_NUL_PATTERN,
    PATTERN_HINTS,
    SBATCH_FLAG_PATTERN,
    WORD_PATTERN,
    Recipe,
)
from clusterkit.spec.schema import profile_json_schema, recipe_json_schema
from clusterkit.spec.text import LINE_PATTERN, NON_EMPTY_LINE_PATTERN
from clusterkit.spec.tracking import TRACKING_PATTERN_HINTS

# The common text patterns by a short name (the page's intro says what a line is); every other
# pattern by the hint the loader's error message gives.
SHORT_TEXT = {LINE_PATTERN: "line", NON_EMPTY_LINE_PATTERN: "line", NO_NUL_PATTERN: "text", WORD_PATTERN: "word"}
KEY_NAMES = {IDENTIFIER_PATTERN: "variable name", SBATCH_FLAG_PATTERN: "option name", KEY_PATH_PATTERN: "key path"}
HINTS = {**PATTERN_HINTS, **TRACKING_PATTERN_HINTS}


def on_files(files: Files, config: Any) -> Files:
    pages = {
        "reference/recipe.md": _schema_page(
            "Recipe reference",
            recipe_json_schema(),
            Recipe,
            "clusterkit schema",
            "A recipe is one YAML file ([the guide](../guides/recipes.md)); `extends:` bases are merged first.",
        ),
        "reference/profile.md": _schema_page(
            "Cluster profile reference",
            profile_json_schema(),
            ClusterProfile,
            "clusterkit schema --profile",
            "A cluster profile is one YAML file an ops team keeps ([the guide](../guides/profiles.md)).",
        ),
        "reference/cli.md": _cli_page(),
    }
    for path, text in pages.items():
        files.append(File.generated(config, path, content=text))
    return files


# -- recipe and profile: from the JSON Schema, with the source's comments ----------------------------------


def _schema_page(title: str, schema: dict[str, Any], root: type, command: str, intro: str) -> str:
    defs = schema["$defs"]
    classes = _struct_classes(root)
    lines = [
        f"# {title}",
        "",
        intro,
        "",
        f"Generated from `{command}`, the JSON Schema clusterkit validates with (unknown keys are errors), "
        "when this site was built. Point your editor's YAML schema setting at that output to have it "
        "complete and check files as you type:",
        "",
        "```bash",
        f"{command} > {'profile' if 'profile' in command else 'recipe'}.schema.json",
        "```",
        "",
        "Types: a *line* is one line of text (no line break or control character, which a job "
        "script could not hold); a *word* is a line without spaces; *text* may span lines (no NUL).",
        "",
    ]
    for name in _reachable(schema["$ref"].rsplit("/", 1)[1], defs):
        definition = defs[name]
        lines += [f"## {name} {{#{name.lower()}}}", ""]
        if definition.get("description"):
            lines += [_markdown(inspect.cleandoc(definition["description"])), ""]
        comments = _field_comments(classes.get(name))
        lines += ["| key | type | default | description |", "|---|---|---|---|"]
        required = set(definition.get("required", ()))
        for key, prop in definition["properties"].items():
            default = "**required**" if key in required else _default(prop)
            text = _descriptions(prop) or comments.get(key, "")
            lines.append(f"| `{key}` | {_type(prop)} | {default} | {_cell(text)} |")
        lines.append("")
    return "\n".join(lines)


def _reachable(root: str, defs: dict[str, Any]) -> list[str]:
    """The definitions in the order a reader meets them: the root, then each as first referenced."""
    order: list[str] = []

    def visit(node: Any) -> None:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if ref and ref.rsplit("/", 1)[1] not in order:
                name = ref.rsplit("/", 1)[1]
                order.append(name)
                visit(defs[name])
            for value in node.values():
                visit(value)
        elif isinstance(node, list):
            for value in node:
                visit(value)

    visit({"$ref": f"#/$defs/{root}"})
    return order


def _struct_classes(root: type) -> dict[str, type]:
    """Every struct a file of this type holds, by the name its schema definition has."""
    found: dict[str, type] = {}

    def visit(info: Any) -> None:
        if isinstance(info, msgspec.inspect.StructType):
            if info.cls.__name__ in found:
                return
            found[info.cls.__name__] = info.cls
            for item in info.fields:
                visit(item.type)
            return
        for attribute in ("type", "item_type", "key_type", "value_type", "types", "item_types"):
            inner = getattr(info, attribute, None)
            for each in inner if isinstance(inner, tuple) else (inner,):
                if isinstance(each, msgspec.inspect.Type):
                    visit(each)

    visit(msgspec.inspect.type_info(root))
    return found


def _field_comments(cls: type | None) -> dict[str, str]:
    """The comment lines just above each field of a class (and one at the end of its line)."""
    if cls is None:
        return {}
    source = textwrap.dedent(inspect.getsource(cls))
    lines = source.splitlines()
    comments = {
        token.start[0]: token.string.lstrip("#").strip()
        for token in tokenize.generate_tokens(io.StringIO(source).readline)
        if token.type == tokenize.COMMENT
    }
    found: dict[str, str] = {}
    for node in ast.parse(source).body[0].body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        above: list[str] = []
        row = node.lineno - 1
        while row in comments and lines[row - 1].strip().startswith("#"):
            above.insert(0, comments[row])
            row -= 1
        if node.end_lineno in comments:
            above.append(comments[node.end_lineno])
        if above:
            found[node.target.id] = " ".join(above)
    return found


def _descriptions(prop: dict[str, Any]) -> str:
    texts = [prop["description"]] if prop.get("description") else []
    texts += [each["description"] for each in prop.get("anyOf", ()) if each.get("description")]
    return " ".join(inspect.cleandoc(text) for text in texts)


def _type(prop: dict[str, Any]) -> str:
    if "$ref" in prop:
        name = prop["$ref"].rsplit("/", 1)[1]
        return f"[{name}](#{name.lower()})"
    if "anyOf" in prop:
        return " or ".join(_type(each) for each in prop["anyOf"])
    if "enum" in prop:
        return " \\| ".join(f"`{json.dumps(value)}`" for value in prop["enum"])
    if "const" in prop:
        return f"`{json.dumps(prop['const'])}`"
    kind = prop.get("type")
    if kind == "string":
        pattern = prop.get("pattern", "")
        if pattern in SHORT_TEXT or not pattern:
            return SHORT_TEXT.get(pattern, "text")
        return f"text: {_markdown(HINTS[pattern])}" if pattern in HINTS else f"text matching `{pattern}`"
    if kind in ("integer", "number"):
        bounds = [f"≥ {prop['minimum']}"] if "minimum" in prop else []
        bounds += [f"> {prop['exclusiveMinimum']}"] if "exclusiveMinimum" in prop else []
        bounds += [f"≤ {prop['maximum']}"] if "maximum" in prop and prop["maximum"] < 1_000_000 else []
        return f"{'integer' if kind == 'integer' else 'number'}{' ' + ', '.join(bounds) if bounds else ''}"
    if kind == "boolean":
        return "true/false"
    if kind == "null":
        return "null"
    if kind == "array":
        return f"list of {_type(prop.get('items', {}))}"
    if kind == "object":
        value = prop.get("additionalProperties")
        if isinstance(value, dict):
            key = KEY_NAMES.get(prop.get("propertyNames", {}).get("pattern", ""), "name")
            return f"mapping of {key} to {_type(value) if value else 'anything'}"
        return "mapping"
    return "anything"


def _default(prop: dict[str, Any]) -> str:
    if "default" not in prop:
        return ""
    return f"`{json.dumps(prop['default'])}`"


def _markdown(text: str) -> str:
    """A docstring or comment as Markdown: reST's double backquotes as code, and outside code the
    characters Markdown would read as markup (``<run_dir>`` as a tag, ``dp*tp`` as emphasis) as text."""
    parts = text.replace("``", "`").split("`")
    for index in range(0, len(parts), 2):  # the even parts are outside code spans
        parts[index] = html.escape(parts[index], quote=False).replace("*", "\\*")
    return "`".join(parts)


def _cell(text: str) -> str:
    return _markdown(" ".join(text.split())).replace("|", "\\|")


# -- the command line: from the parser ---------------------------------------------------------------------


def _cli_page() -> str:
    os.environ["COLUMNS"] = "100"  # argparse wraps help to the terminal; the page has a width of its own
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    lines = [
        "# Command line reference",
        "",
        "Each command's `--help`, generated from clusterkit's own parser when this site was built. "
        "`--json` output is documented in [JSON output](../json.md).",
        "",
        "```text",
        parser.format_help().rstrip(),
        "```",
        "",
    ]
    for name, command in commands.items():
        lines += [f"## `clusterkit {name}` {{#{name}}}", "", "```text", command.format_help().rstrip(), "```", ""]
    return "\n".join(lines)

"""An imported recipe as YAML text, its not-mapped list as comments above it, and the cluster
profile derived from a script's header where no ``--cluster`` was given."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import yaml

if TYPE_CHECKING:
    from clusterkit.load.import_script import Imported


def recipe_yaml(imported: Imported, script: str, cluster: str) -> str:
    lines = [f"# Imported by `clusterkit import` from {printable(script)}: read, never run."]
    if imported.unmapped:
        lines.append("# Not mapped (line: what, why, the nearest field):")
        lines += [
            f"#   {item.line}: {printable(item.text[:100])} ({item.why}; nearest: {item.nearest})"
            for item in imported.unmapped
        ]
    recipe = {"name": imported.recipe["name"], "cluster": cluster, **imported.recipe}
    text = yaml.dump(recipe, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=1000)
    return "\n".join(lines) + "\n" + text


_PLAIN_WORDS = {"true", "false", "yes", "no", "on", "off", "null", "~", ".inf", ".nan", "-.inf"}


class _Dumper(yaml.SafeDumper):
    """Quotes every string that starts like a number or reads as a boolean/null (0:10:00, 1e-5,
    on): the loader must read each as the text it was in the script."""


def _string(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = '"' if re.match(r"^[-+.]?[0-9]", value) or value.lower() in _PLAIN_WORDS else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _string)


def derived_profile(imported: Imported) -> str:
    """A cluster profile from the header: GPUs asked for as the script asks, its partition."""
    header = imported.header
    gpus = header.gpus_per_node or imported.recipe.get("resources", {}).get("gpus_per_node")
    cpus = max(1, imported.recipe.get("resources", {}).get("cpus_per_task") or 1) * max(1, header.tasks_per_node or 1)
    profile = {
        "name": f"{imported.recipe['name']}-site",
        "description": "derived by clusterkit import from the script's #SBATCH header; check it",
        "accelerator": "gpu" if gpus else "cpu",
        "gpus_per_node": gpus or 1,
        "gpu_request": header.gpu_request if gpus else "none",
        "cpus_per_node": max(cpus, gpus or 1),
        "interconnect": "infiniband" if any(n.startswith("NCCL_IB") for n in imported.env) else "ethernet",
    }
    return yaml.safe_dump(profile, sort_keys=False)


def printable(text: str) -> str:
    """``text`` with each control character (an escape sequence, a line break) shown as ``?``."""
    return "".join(c if c.isprintable() else "?" for c in text)

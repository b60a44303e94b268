"""``clusterkit profile init NAME``: a cluster profile written from the cluster itself (its
partitions, nodes, GRES, features, version and the options its sbatch and srun take), asked here or
on a login node over SSH (``--cluster P``, ``--login HOST``), each value under a comment saying
where it came from; then the tiny recipe validated against it, and one line per thing the cluster
did not tell.

Exit codes: 0 written and the tiny recipe validates against it; 1 SLURM could not be asked, or the
profile is written but the tiny recipe does not validate on it (its lines say why); 2 a bad NAME,
an output path that exists (nothing is ever replaced) or a partition that is not there.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import tempfile
from collections.abc import Iterator
from typing import TYPE_CHECKING

from clusterkit.cli.common import EXIT_FAILURE, print_json, with_host_keys, with_json

if TYPE_CHECKING:
    from pathlib import Path

    from clusterkit.schedulers.host import Host
    from clusterkit.spec.profile import Login

# Validated against the new profile: the shipped tiny recipe on one node of it.
TINY_RECIPE = "tiny-gpt2-cpu"


def profile_file_name(name: str) -> str:
    """NAME as a file name that ``cluster: NAME`` finds: a word of letters, digits, '.', '_' and '-'."""
    from clusterkit.errors import UsageError
    from clusterkit.spec.recipe import NAME_PATTERN

    if not re.fullmatch(NAME_PATTERN, name) or name.endswith((".yaml", ".yml")):
        shown = ascii(name)
        raise UsageError(
            f"profile name {shown}: letters, digits, '.', '_' and '-', starting with a letter or digit, "
            "at most 64, without .yaml (it is the file's name: cluster: NAME finds NAME.yaml)"
        )
    return f"{name}.yaml"


def output_path(args: argparse.Namespace) -> Path:
    from pathlib import Path

    from clusterkit.errors import PathError
    from clusterkit.load.user_config import load_user_config

    file_name = profile_file_name(args.name)
    target = Path(args.output).expanduser() if args.output else load_user_config().own_profiles / file_name
    if os.path.lexists(target):
        raise PathError(f"{target}: already exists; nothing written (give another NAME, or -o FILE)")
    if args.output and not target.parent.is_dir():
        raise PathError(f"{target.parent}: no such folder; nothing written")
    if not args.output:
        target.parent.mkdir(parents=True, exist_ok=True)  # the user's own profiles: made on first use
    return target


@contextlib.contextmanager
def cluster_host(args: argparse.Namespace) -> Iterator[tuple[Host, Login | None]]:
    """Where SLURM is asked, and the login node the new profile names (None: this machine)."""
    from pathlib import Path

    from clusterkit.errors import UsageError
    from clusterkit.schedulers.api import is_this_host, open_scheduler
    from clusterkit.schedulers.host import LocalHost

    login = None
    if args.cluster:
        from clusterkit.load.loader import load_profile

        profile, profile_path, _ = load_profile(args.cluster, Path.cwd())
        login = profile.login
        if login is None:
            raise UsageError(
                f"{profile_path}: cluster profile {profile.name!r} names no login node (login: {{host: ...}}): "
                "run clusterkit profile init on the cluster, or give --login HOST"
            )
    elif args.login:
        login = _login(args.login)
    if login is None or is_this_host(login.host):
        yield LocalHost(), login
        return
    with open_scheduler("ssh", login, args.accept_new_host_key) as scheduler:
        yield scheduler.host, login


def _login(host: str) -> Login:
    import msgspec

    from clusterkit.errors import UsageError
    from clusterkit.spec.profile import Login

    try:
        return msgspec.convert({"host": host}, Login, strict=True)
    except msgspec.ValidationError:
        raise UsageError(
            f"--login {ascii(host)}: a host name, address or ~/.ssh/config alias, no spaces or shell characters"
        ) from None


def write_new(target: Path, text: str) -> None:
    """``target`` with ``text`` whole, or nothing: written beside it under another name, then linked
    to its name, which fails where anything is there (a file, a link, a FIFO), so nothing is ever
    replaced, even one made since it was checked."""
    from clusterkit.errors import PathError

    descriptor, staging = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(staging, 0o644)  # a profile is the site's description, no secret
        os.link(staging, target)
    except FileExistsError:
        raise PathError(f"{target}: already exists; nothing written (give another NAME, or -o FILE)") from None
    finally:
        os.unlink(staging)


def tiny_recipe_check(target: Path, gpus_per_node: int) -> tuple[list[str], list[str]]:
    """The tiny recipe on one node of the new profile, checked as ``clusterkit validate`` does: its
    errors (none: it validates) and warnings, one line each."""
    from clusterkit import api
    from clusterkit.errors import RecipeError

    overrides = {"resources.nodes": 1, "resources.gpus_per_node": gpus_per_node, "resources.cpus_per_task": 1}
    try:
        checked = api.validate(TINY_RECIPE, overrides, cluster=str(target.absolute()))
    except RecipeError as exc:
        return str(exc).splitlines(), []
    return [], checked.warnings


def cmd_profile_init(args: argparse.Namespace) -> int:
    from pathlib import Path

    from clusterkit.diagnose.site_profile import draft_profile, one_line, profile_yaml
    from clusterkit.load.user_config import load_user_config
    from clusterkit.schedulers.slurm_site import read_site
    from clusterkit.spec.profile import find_profile

    target = output_path(args)  # before the cluster is asked: a name or path that cannot be written stops here
    with cluster_host(args) as (where, login):
        site = read_site(where)
    draft = draft_profile(site, args.name, args.partition, login)
    heading = (
        f"Written by clusterkit profile init from SLURM {site.version or '(version unknown)'}, asked on {site.host}\n"
        "(scontrol show partition/node/config, sbatch --help, srun --help). Each value's comment says where\n"
        "it came from; check the ones NOT DETERMINED. Every key: docs/reference/profile.md"
    )
    write_new(target, profile_yaml(draft, heading))
    errors, warnings = tiny_recipe_check(target, draft.values["gpus_per_node"])
    found = find_profile(args.name, Path.cwd(), load_user_config().profile_directories())
    by_name = found is not None and found.resolve() == target.resolve()
    if args.json:
        print_json(
            {
                "path": str(target),
                "profile": draft.values,
                "origins": draft.origins,
                "undetermined": draft.undetermined,
                "notes": draft.notes,
                "slurm_version": site.version,
                "asked_on": site.host,
                "tiny_recipe_errors": errors,
                "tiny_recipe_warnings": warnings,
                "found_by_name": by_name,
            }
        )
        return EXIT_FAILURE if errors else 0
    print(f"wrote {target}")
    for line in draft.undetermined:
        print(f"not determined: {one_line(line)}")  # the cluster's text: no terminal escapes
    for line in [*errors, *warnings]:
        print(f"tiny recipe: {line}")
    if not errors:
        print(f"the tiny recipe ({TINY_RECIPE}) validates on it")
    if not by_name:
        shadow = f"finds {found} first" if found else "does not find it from here (not in a profile folder)"
        print(f"a recipe's cluster: {args.name} {shadow}: write cluster: {target}")
    return EXIT_FAILURE if errors else 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("profile", help="cluster profiles: init writes one from the cluster itself")
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    init = actions.add_parser(
        "init",
        help="write a cluster profile from what SLURM says of the cluster (partitions, GPUs, CPUs, memory, "
        "time limit, network, containers, sbatch's options)",
    )
    init.add_argument("name", metavar="NAME", help="the profile's name (a recipe's cluster: NAME)")
    init.add_argument("--partition", help="the partition the profile runs on (default: SLURM's default partition)")
    where = init.add_mutually_exclusive_group()
    where.add_argument("--cluster", metavar="PROFILE", help="ask on the login node of this existing profile (SSH)")
    where.add_argument("--login", metavar="HOST", help="ask on this login node over SSH; the new profile names it")
    init.add_argument(
        "-o",
        "--output",
        metavar="FILE",
        help="write here (default: NAME.yaml in clusters/ beside your user config, where cluster: NAME finds it); "
        "never replaces a file",
    )
    with_json(init)
    with_host_keys(init)
    init.set_defaults(func=cmd_profile_init)

"""The property behind issue 11's promise, shared by tests/test_hostile_fields.py (a few hundred cases)
and bench/fuzz_recipes.py (tens of thousands): put a hostile string into ANY string field of a recipe
or cluster profile (or a dict key, or a list item), through the file or through ``--set``. Then either

- ``validate`` refuses it with one-line errors and exit code 2, writing nothing; or
- the rendered ``job.sbatch`` passes ``bash -n`` and shellcheck and, run by real bash (and the real
  supervisor and node agent it starts) with stub ``srun``/``scontrol``/``module`` and a stub
  ``python3`` as the ranks' interpreter, creates no canary file, writes nothing outside its run
  directory, and hands every env value and script argument to the program byte for byte.

The string fields are read from the recipe and profile types themselves (msgspec.inspect), so a new
field is fuzzed the day it is added. ``setup`` lines are left out: they are shell on purpose.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec.inspect as mi
import yaml
from hypothesis import strategies as st

from clusterkit.cli.main import main
from clusterkit.spec.profile import ClusterProfile
from clusterkit.spec.recipe import Recipe

KEY = "<key>"  # in a field path: the hostile string is a mapping key there (env names, extra_sbatch flags)
SHELL_ON_PURPOSE = {("setup",), ("hooks",)}  # shell written on purpose, run as written
# Fields that name a program the job starts: a hostile name is a program that is not there (the job
# fails saying so), never shell.
PROGRAM_FIELDS = {("python",), ("python", 0), ("host_python",), ("container", "python"), ("task", "program")}
ONE_LINE_ERROR = re.compile(r"^[^\n]+: \S.*$")
JOB_ID = "4242"
# {env:NAME} is filled in where the job runs (task args, env values, the container's image and mounts):
# the job's environment sets NAME to this hostile value, which must arrive as text, in one pass.
ENV_REFERENCE, ENV_NAME = "{env:CK_HOSTILE}", "CK_HOSTILE"
ENV_VALUE = "$(touch CANARY/env)`touch CANARY/env2`'\"\n{env:HOME}{run_dir}*"


def _accepts_str(info: Any) -> bool:
    if isinstance(info, mi.Metadata):
        info = info.type
    if isinstance(info, mi.UnionType):
        return any(_accepts_str(t) for t in info.types)
    return isinstance(info, mi.StrType)


def string_fields(info: Any, path: tuple = ()) -> list[tuple]:
    """Every path in a struct type where a string can go (values, mapping keys, list items)."""
    if isinstance(info, mi.Metadata):
        info = info.type
    found: list[tuple] = []
    if isinstance(info, mi.StructType):
        for f in info.fields:
            found += string_fields(f.type, path + (f.name,))
    elif isinstance(info, mi.UnionType):
        if any(isinstance(t, mi.StrType) or _accepts_str(t) for t in info.types):
            found.append(path)
        for t in info.types:
            if not _accepts_str(t):
                found += [p for p in string_fields(t, path) if p != path]
    elif isinstance(info, mi.StrType):
        found.append(path)
    elif isinstance(info, mi.DictType):
        if _accepts_str(info.key_type):
            found.append(path + (KEY,))
        found += string_fields(info.value_type, path + ("x",))
    elif isinstance(info, (mi.ListType, mi.TupleType, mi.VarTupleType)):
        item = info.item_type if hasattr(info, "item_type") else info.item_types[0]
        found += string_fields(item, path + (0,))
    return [p for p in dict.fromkeys(found) if p[:1] not in {s[:1] for s in SHELL_ON_PURPOSE}]


RECIPE_FIELDS = string_fields(mi.type_info(Recipe))
PROFILE_FIELDS = string_fields(mi.type_info(ClusterProfile))

PROFILE = {
    "name": "fuzzprofile",
    "accelerator": "cpu",
    "gpus_per_node": 2,
    "gpu_request": "none",
    "cpus_per_node": 2,
    "partition": "debug",
    "interconnect": "loopback",
    "modules": ["mod/1"],
    "runs_dir": "runs",
    "container": {"image": "img", "mounts": ["/a:/b"], "workdir": "/w"},
    "env": {"PROFILE_ENV": "p"},
    "network_env": {"NET_ENV": "n"},
    "python": "python3",
    # The supervisor's interpreter: this one (``python3`` on the sandbox's PATH is the ranks' stub).
    "host_python": sys.executable,
    "login": {"host": "h", "user": "u", "proxy_jump": "j", "identity_file": "k", "remote_workdir": "w"},
}
SCRIPT_RECIPE = {
    "name": "fuzz",
    "cluster": "profile.yaml",
    "launcher": "torchrun",
    "resources": {
        "nodes": 2,
        "gpus_per_node": 2,
        "time": "10",
        "account": "acct",
        "qos": "q",
        "constraint": "c",
        "reservation": "r",
        "mem": "1G",
        "extra_sbatch": {"comment": "c"},
    },
    "task": {"script": "train.py", "args": ["--x", "{run_dir}/y"]},
    "env": {"RECIPE_ENV": "e"},
    "network": {"env": {"NCCL_DEBUG_SUBSYS": "INIT"}},
    "runs_dir": "runs",
    "description": "d",
    "preflight": {"enabled": True},
}
# task.program exec'd per rank by launcher srun: the stub python3 stands for the program (the preflight's
# ranks still run under the real launch's Python).
PROGRAM_RECIPE = {
    **SCRIPT_RECIPE,
    "name": "fuzzprog",
    "launcher": "srun",
    "task": {"program": "python3", "args": ["--x", "{run_dir}/y"]},
}
TRAINER_RECIPE = {
    "name": "fuzzds",
    "cluster": "profile.yaml",
    "launcher": "deepspeed",
    "resources": {"nodes": 2, "gpus_per_node": 2, "time": "10"},
    "parallelism": {"zero_stage": 1, "micro_batch_size": 2},
    "deepspeed": {"include": "127.0.0.1:0,1@127.0.0.2:0,1"},
    "task": {
        "trainer": {
            "model": {
                "config": {
                    "model_type": "gpt2",
                    "n_layer": 2,
                    "n_head": 2,
                    "n_embd": 16,
                    "vocab_size": 64,
                    "n_positions": 64,
                }
            },
            "dataset": {"type": "synthetic", "seq_len": 16},
            "args": {"max_steps": 1},
        }
    },
    "runs_dir": "runs",
}
# The same program as a front end in the batch shell (launcher command): run once by the supervisor.
FRONT_END_RECIPE = {**PROGRAM_RECIPE, "launcher": "command", "process_model": "batch_launcher", "preflight": False}

# A job of several steps (steps:): a step's name, task, launcher_args, srun and env are its own fields.
STEPS_RECIPE = {
    "name": "fuzzsteps",
    "cluster": "profile.yaml",
    "launcher": "torchrun",
    "resources": {"nodes": 2, "gpus_per_node": 2, "time": "10"},
    "steps": [
        {"name": "prep", "nodes": 1, "task": {"script": "prep.py", "args": ["--out", "{run_dir}/d"]}},
        {
            "name": "train",
            "task": {"script": "train.py", "args": ["--x"]},
            "launcher_args": ["--max-restarts=0"],
            "srun": {"label": True, "extra": {"comment": "c"}},
        },
        {"name": "eval", "repeat": 2, "task": {"script": "eval.py", "args": ["--seed={trial}"]}, "env": {"S": "e"}},
    ],
    "runs_dir": "runs",
}
BASES = {
    "script": SCRIPT_RECIPE,
    "trainer": TRAINER_RECIPE,
    "program": PROGRAM_RECIPE,
    "front_end": FRONT_END_RECIPE,
    "steps": STEPS_RECIPE,
}


def hostile_tokens(canary: str) -> list[str]:
    return [
        "'",
        '"',
        "\\",
        "$(touch CANARY/dollar)",
        "`touch CANARY/backtick`",
        ";touch CANARY/semicolon;",
        "%",
        "%j",
        "{{ 7*7 }}",
        "{% raw %}",
        "\n",
        "\r",
        "\u2028",
        "\u2029",
        "\x85",
        "\x00",
        "\x1b[31m",
        "\x07",
        "-",
        "--x",
        " ",
        "\t",
        "~",
        "*",
        "&&",
        "|",
        ">CANARY/redirect",
        "CLUSTERKIT_EOF",
        "a",
        "é",
        "x=y,z",
        "#",
        "!",
        ENV_REFERENCE,
    ]


def hostile_strings(canary: str) -> st.SearchStrategy[str]:
    tokens = [t.replace("CANARY", canary) for t in hostile_tokens(canary)]
    return st.lists(st.sampled_from(tokens), min_size=1, max_size=6).map("".join)


@dataclass(frozen=True)
class Case:
    target: str  # "recipe", "profile" or "args" (the words after render's --: the script's arguments)
    path: tuple
    value: str
    base: str  # "script", "trainer", "program" or "front_end" (BASES)
    base: str  # a key of BASES: "script", "trainer" or "steps"
    via_set: bool  # through --set instead of the file (recipe fields only)


def cases(canary: str) -> st.SearchStrategy[Case]:
    recipe_case = st.builds(
        Case,
        st.just("recipe"),
        st.sampled_from(RECIPE_FIELDS),
        hostile_strings(canary),
        st.sampled_from(sorted(BASES)),
        st.booleans(),
    )
    profile_case = st.builds(
        Case,
        st.just("profile"),
        st.sampled_from(PROFILE_FIELDS),
        hostile_strings(canary),
        st.sampled_from(sorted(BASES)),
        st.just(False),
    )
    args_case = st.builds(
        Case, st.just("args"), st.just(("--",)), hostile_strings(canary), st.just("script"), st.just(False)
    )
    return st.one_of(recipe_case, profile_case, args_case)


def _put(data: dict, path: tuple, value: str) -> None:
    node: Any = data
    for depth, part in enumerate(path[:-1]):
        nxt = path[depth + 1]
        if isinstance(part, int):
            if not isinstance(node, list) or not node:
                return
            node = node[0]
            continue
        if not isinstance(node.get(part), (dict, list)):
            node[part] = [] if isinstance(nxt, int) else {}
        if isinstance(nxt, int) and isinstance(node[part], list) and not node[part]:
            node[part].append({} if len(path) > depth + 2 else "")
        node = node[part]
    last = path[-1]
    if last == KEY:
        node[value] = "v"
    elif isinstance(last, int):
        if isinstance(node, list):
            node[:1] = [value]
    else:
        node[last] = value


def _set_argument(path: tuple, value: str) -> str | None:
    """``--set a.b=JSON``: exact through YAML's flow syntax. Keys and list items are not settable."""
    if KEY in path or any(isinstance(p, int) for p in path):
        return None
    return f"{'.'.join(path)}={json.dumps(value)}"


_STUB = """#!/bin/bash
# Stand-in for {name}: records its words NUL-separated (and its environment), does nothing more.
printf '%s\\0' "$@" >> "{records}/{name}.argv"
printf '\\n' >> "{records}/{name}.calls"
env -0 > "{records}/{name}.env"
{extra}
"""
# srun runs the node agent of one task (node 0, rank 0) with the real interpreter, whichever the
# plan names (pyxis's is the image's): the agent then starts the step's program, the stub python3.
_SRUN = f"""while [ "$#" -gt 0 ] && [ "${{1#--}}" != "$1" ]; do shift; done
while [ "$#" -gt 0 ] && [ "${{1%/supervisor}}" = "$1" ]; do shift; done
[ "$#" -gt 0 ] || exit 0
SLURM_NODEID=0 SLURM_PROCID=0 SLURM_LOCALID=0 SLURMD_NODENAME=127.0.0.1 exec {sys.executable} "$@"
"""


def _stubs(bin_dir: Path, records: Path) -> None:
    extras = {
        "srun": _SRUN,
        "scontrol": 'if [ "$1" = show ]; then printf "127.0.0.1\\n127.0.0.2\\n"; fi',
        "module": "",
        "python3": "",
    }
    for name, extra in extras.items():
        path = bin_dir / name
        path.write_text(_STUB.format(name=name, records=records, extra=extra))
        path.chmod(0o755)


def check_case(case: Case, canary: Path, shellcheck: bool = True) -> str:
    """Run one case; returns "refused" or "executed". Raises AssertionError if the promise breaks."""
    work = Path(tempfile.mkdtemp(prefix="ck-hostile-"))
    try:
        recipe = json.loads(json.dumps(BASES[case.base]))
        profile = json.loads(json.dumps(PROFILE))
        if case.base == "front_end":  # a launcher in the batch shell runs no container (refused)
            del profile["container"]
        overrides: list[str] = []
        if case.target == "profile":
            _put(profile, case.path, case.value)
        elif case.via_set and _set_argument(case.path, case.value):
            overrides.append(_set_argument(case.path, case.value))  # type: ignore[arg-type]
        elif case.target == "recipe":
            _put(recipe, case.path, case.value)
        # Escaped (allow_unicode=False): a raw NEL or U+2028 would be folded by YAML itself, and the
        # point is that the hostile value reaches the loader exactly.
        (work / "profile.yaml").write_text(yaml.safe_dump(profile, allow_unicode=False))
        (work / "recipe.yaml").write_text(yaml.safe_dump(recipe, allow_unicode=False))
        out = work / "out"
        argv = ["render", str(work / "recipe.yaml"), "-o", str(out)]
        for override in overrides:
            argv += ["--set", override]
        if case.target == "args":
            argv += ["--", case.value]
        stdout, stderr = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            code = main(argv)
        err = stderr.getvalue()
        assert "Traceback" not in err, err
        if code != 0:
            assert code == 2, (case, code, err)
            assert not out.exists(), f"a refused recipe wrote output: {case}"
            lines = err.splitlines()
            assert lines and all(ONE_LINE_ERROR.match(line) for line in lines), (case, err)
            assert all(ch.isprintable() for line in lines for ch in line), f"unescaped control character: {err!r}"
            return "refused"
        _execute(out / "job.sbatch", work, canary, case, shellcheck)
        return "executed"
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _execute(script: Path, work: Path, canary: Path, case: Case, shellcheck: bool) -> None:
    syntax = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert syntax.returncode == 0, (case, syntax.stderr)
    if shellcheck:
        # Warnings and errors; not SC2016 "expressions don't expand in single quotes" (info), which is
        # exactly what a quoted hostile value should do. The shipped renders pass at every level (test_render).
        lint = subprocess.run(
            ["shellcheck", "-s", "bash", "-S", "warning", str(script)], capture_output=True, text=True
        )
        assert lint.returncode == 0, (case, lint.stdout)
    sandbox, bin_dir, records = work / "sandbox", work / "bin", work / "records"
    for d in (sandbox, bin_dir, records):
        d.mkdir()
    _stubs(bin_dir, records)
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "HOME": str(work / "home"),
        "SLURM_JOB_ID": JOB_ID,
        "SLURM_JOB_NODELIST": "127.0.0.[1-2]",
        "SLURM_NNODES": "2",
        "LANG": "C.UTF-8",
        ENV_NAME: ENV_VALUE.replace("CANARY", str(canary)),
    }
    resolved = yaml.safe_load((script.parent / "recipe.resolved.yaml").read_text())
    run_dir = (sandbox / resolved["runs_dir"] / resolved["name"] / JOB_ID).resolve()
    # As submit does: the rendered files in the run directory before the job starts.
    shutil.copytree(script.parent, run_dir)
    done = subprocess.run(
        ["bash", str(run_dir / "job.sbatch")], cwd=sandbox, env=env, capture_output=True, text=True, timeout=60
    )
    assert sorted(os.listdir(canary)) == [], f"a hostile value was executed: {case}"
    if done.returncode != 0 and case.path in PROGRAM_FIELDS:
        assert done.returncode in (126, 127) and (
            "clusterkit: cannot start" in done.stderr or "exec: " in done.stderr or "No such file" in done.stderr
        ), (case, done.stderr[-2000:])
        return
    assert done.returncode == 0, (case, done.stdout[-2000:], done.stderr[-2000:])
    assert (run_dir / "job.json").is_file() and (run_dir / "exit_code").read_text().strip() == "0", case
    outside = [p for p in sandbox.rglob("*") if p.is_file() and run_dir not in p.resolve().parents]
    assert outside == [], f"wrote outside its run dir: {outside} ({case})"
    # What the launch's program got, through the supervisor and the node agent (the stub python3's
    # last call is the launch's). read_bytes: read_text would turn a "\r" into "\n" (universal newlines).
    program_env = dict(
        item.split("=", 1) for item in (records / "python3.env").read_bytes().decode().split("\0") if "=" in item
    )

    def filled_in(text: str) -> str:
        return text.replace(ENV_REFERENCE, env[ENV_NAME])

    for key, value in {**resolved["env"], **resolved["network"]["env"]}.items():
        if isinstance(value, str):
            assert program_env.get(key) == filled_in(value), (case, key)
    program_words = (records / "python3.argv").read_bytes().decode().split("\0")
    for arg in resolved["task"]["args"]:
        if "{run_dir}" not in arg:
            assert filled_in(arg) in program_words, (case, arg)
    steps = resolved["steps"] or []
    for step in steps:  # each step's program was started, its words exact (the stub appends each call's)
        for arg in step["task"]["args"]:
            if "{" not in arg:
                assert filled_in(arg) in program_words, (case, step["name"], arg)
    for key, value in (steps[-1]["env"] if steps else {}).items():  # the last call is the last step's
        assert program_env.get(key) == str(value), (case, key)

"""The launch line of a batch script taken apart: the srun options around it, the launcher
(torchrun, DeepSpeed, accelerate, mpirun, a python per task, or a command of the user's own), the
launcher's options, the interpreter, the program and its arguments. Words only: nothing runs."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from clusterkit.load.script_text import COMPUTED, is_redirection, split_commands, words_of

PYTHON = re.compile(r"^(.*/)?python[0-9.]*$")
SRUN_BARE = frozenset(
    "label unbuffered exclusive overlap immediate no-kill quit-on-interrupt verbose quiet pty exact "
    "disable-status multi-prog no-allocate test-only l u k q v X".split()
)
SRUN_SHORT_VALUE = frozenset("N n c p t J o e w x A G m D d".split())  # -N 2, -n 16, ...
# Each launcher's options that stand alone (every other option takes a value), names as normalised.
LAUNCHER_BARE = {
    "torchrun": frozenset({"standalone", "no-python", "module", "m", "run-path"}),
    "deepspeed": frozenset(
        {"no-python", "module", "no-local-rank", "force-multi", "no-ssh-check", "elastic-training", "no-ssh"}
    ),
    "accelerate": frozenset(
        "multi-gpu cpu use-deepspeed use-fsdp use-megatron-lm same-network module m no-python debug quiet q "
        "tpu enable-cpu-affinity".split()
    ),
    "mpirun": frozenset(
        "oversubscribe tag-output report-bindings allow-run-as-root v q display-map timestamp-output".split()
    ),
}
CONTAINER_BARE = frozenset(
    "--nv --rocm --nvccli --cleanenv -e --contain -c --containall -C --writable-tmpfs --no-home --no-mount".split()
)
OPTIONS_VARIABLE = re.compile(r"\$(?:\{[A-Za-z_][A-Za-z0-9_]*(?:\[[@*]\])?\}|[A-Za-z_][A-Za-z0-9_]*)")
# docker/podman run's flags that take no value (its -e and -v do)
RUN_BARE = frozenset("--rm --init --privileged -i -t -it -d --detach --interactive --tty --read-only --replace".split())
SHIFTER_BARE = frozenset({"--help", "--verbose", "-v"})
ENROOT_START_BARE = frozenset({"--rw", "-w", "--root", "-r"})
MPIRUN_TWO_VALUES = frozenset({"mca", "gmca"})
TORCHRUN_MODULES = frozenset({"torch.distributed.run", "torch.distributed.launch"})
DEEPSPEED_MODULES = frozenset({"deepspeed.launcher.runner"})
ACCELERATE_MODULES = frozenset({"accelerate.commands.launch"})


@dataclass
class Launch:
    """A launch line's parts; ``options`` are the launcher's own, (normalised name, flag as written, value)."""

    line: int
    launcher: str
    srun: list[tuple[str, str | None]] = field(default_factory=list)
    python: list[str] = field(default_factory=list)  # the interpreter's argv, where one was written
    options: list[tuple[str, str, str | None]] = field(default_factory=list)
    program: str = ""
    module: bool = False
    args: list[str] = field(default_factory=list)
    prefix_env: dict[str, str] = field(default_factory=dict)  # VAR=value words before the command
    redirections: list[str] = field(default_factory=list)
    container: str | None = None  # the image of an `apptainer exec [options] IMAGE` before the launcher
    container_runtime: str = ""  # which runtime's command that was (apptainer, singularity, docker, ...)
    container_options: list[str] = field(default_factory=list)  # its options before the image, as written
    beside: list[str] = field(default_factory=list)  # other commands in its `bash -c` / on its line
    under_srun: bool = False  # started by srun (a task each), not in the batch shell
    batch_shell: bool = False  # run once in the batch shell, starting the ranks itself (a launch plan's)


def normalise(flag: str) -> str:
    """``--nproc_per_node`` -> ``nproc-per-node`` (launchers take both spellings)."""
    return flag.lstrip("-").replace("_", "-")


def launcher_of(words: list[str]) -> str | None:
    """Which launcher a command's words (after srun and env prefixes) start, or None for none."""
    if not words:
        return None
    first = words[0].rsplit("/", 1)[-1]
    if first in ("torchrun", "deepspeed", "mpirun", "mpiexec"):
        return "mpirun" if first == "mpiexec" else first
    if first == "accelerate" and words[1:2] == ["launch"]:
        return "accelerate"
    if PYTHON.match(words[0]):
        module = _python_module(words)
        if module in TORCHRUN_MODULES:
            return "torchrun"
        if module in DEEPSPEED_MODULES:
            return "deepspeed"
        if module in ACCELERATE_MODULES:
            return "accelerate"
        return "python"
    return None


def _python_module(words: list[str]) -> str | None:
    interpreter, rest = _interpreter(words)
    return rest[1] if rest[:1] == ["-m"] and len(rest) > 1 else None


def _interpreter(words: list[str]) -> tuple[list[str], list[str]]:
    """``python -u -X dev x.py`` -> ([python, -u, -X, dev], [x.py]); ``-m`` starts the rest."""
    at = 1
    while at < len(words) and words[at].startswith("-") and words[at] != "-m":
        at += 2 if words[at] in ("-X", "-W") else 1
    return words[:at], words[at:]


def parse_launch(line: int, words: list[str], under_srun: bool = False, literal: bool = False) -> Launch | None:
    """The launch in ``words`` (one command, separators already cut), or None where it starts none;
    ``under_srun``: the words are what an srun runs (any command is then the launch); ``literal``:
    an argv as a launch plan holds it (a ``bash -c`` there is the user's command, not a line to read)."""
    words, redirections = _without_redirections(words)
    prefix_env, words = _env_prefix(words)
    srun: list[tuple[str, str | None]] = []
    if words and words[0].rsplit("/", 1)[-1] == "srun":
        srun, words = _srun_options(words[1:])
        under_srun = True  # with or without options of its own
    if words[:1] == ["env"] and (assigned := _env_prefix(words[1:]))[0] and assigned[1]:
        prefix_env, words = {**prefix_env, **assigned[0]}, assigned[1]  # `env NAME=value ... enroot start`
    runtime, container, container_options, words = _container(words)
    if not literal and len(words) >= 3 and words[0].rsplit("/", 1)[-1] in ("bash", "sh") and words[1] == "-c":
        inner = _inner(line, words[2], srun, prefix_env, redirections)
        if inner is not None and container is not None:  # `singularity run IMG bash -c "..."`: still in it
            inner.container, inner.container_runtime, inner.container_options = container, runtime, container_options
        return inner
    if not words:  # `srun --flag` with no command: nothing launched
        return None
    kind = launcher_of(words) or "command"
    launch = Launch(line, kind, srun=srun, prefix_env=prefix_env, redirections=redirections, container=container)
    launch.under_srun = under_srun
    launch.container_runtime, launch.container_options = runtime, container_options
    _fill(launch, words)
    return launch if (srun or under_srun or kind != "command") and launch.program else None


def srun_step(words: list[str]) -> tuple[dict[str, str], list[tuple[str, str | None]], list[str], list[str]] | None:
    """An ``[VAR=value ...] srun [options] argv [redirections]`` command's parts as written (a
    heterogeneous job component's step): (prefix env, srun options, argv, redirections); None where
    it is no srun step."""
    words, redirections = _without_redirections(words)
    prefix_env, words = _env_prefix(words)
    if not words or words[0].rsplit("/", 1)[-1] != "srun":
        return None
    options, argv = _srun_options(words[1:])
    return prefix_env, options, argv, redirections


def _inner(
    line: int, text: str, srun: list[tuple[str, str | None]], prefix_env: dict[str, str], redirections: list[str]
) -> Launch | None:
    inner = words_of(text)
    if inner is None:
        return None
    parts = split_commands(inner)
    found = [part for part in parts if launcher_of(_env_prefix(part)[1])]
    chosen = found[-1] if found else (parts[-1] if parts else [])
    launch = parse_launch(line, chosen, under_srun=True) if chosen else None
    if launch is None:
        return None
    launch.srun = srun
    launch.prefix_env = {**prefix_env, **launch.prefix_env}
    launch.redirections = redirections + launch.redirections
    launch.beside = [" ".join(part) for part in parts if part is not chosen]
    return launch


def _fill(launch: Launch, words: list[str]) -> None:
    if launch.launcher == "command":
        launch.program, launch.args = words[0], words[1:]
        return
    if PYTHON.match(words[0]):
        launch.python, words = _interpreter(words)
        if launch.launcher != "python":
            words = words[2:]  # -m torch.distributed.run and the like
    else:
        words = words[2:] if launch.launcher == "accelerate" else words[1:]
    if launch.launcher == "python":
        _program(launch, words)
        return
    bare = LAUNCHER_BARE[launch.launcher]
    at = 0
    while at < len(words) and words[at].startswith("-") and words[at] != "--":
        flag, _, value = words[at].partition("=")
        name = normalise(flag)
        if name in ("m", "module") and launch.launcher in ("torchrun", "accelerate", "deepspeed"):
            launch.module = True
            at += 1
            continue
        if "=" in words[at]:
            launch.options.append((name, flag, value))
            at += 1
        elif name in bare or at + 1 >= len(words):
            launch.options.append((name, flag, None))
            at += 1
        elif launch.launcher == "mpirun" and name in MPIRUN_TWO_VALUES and at + 2 < len(words):
            launch.options.append((name, flag, f"{words[at + 1]} {words[at + 2]}"))
            at += 3
        else:
            launch.options.append((name, flag, words[at + 1]))
            at += 2
    rest = words[at:]
    if launch.launcher == "mpirun" and rest and PYTHON.match(rest[0]):
        launch.python, rest = _interpreter(rest)
    _program(launch, rest)


def wrapped_python(launch: Launch, argv: list[str]) -> None:
    """A task-per-rank argv whose interpreter runs under a wrapper (``run_env.sh singularity exec
    IMAGE python -u x.py``): the interpreter is everything up to the first python and its flags. One
    with no Python in it is a program each rank runs as it is (launcher srun)."""
    at = next((i for i, word in enumerate(argv) if PYTHON.match(word)), None)
    if at is None:
        launch.launcher = "srun"
        return
    interpreter, rest = _interpreter(argv[at:])
    launch.launcher, launch.python, launch.module, launch.program, launch.args = (
        "python",
        argv[:at] + interpreter,
        False,
        "",
        [],
    )
    _program(launch, rest)


def _program(launch: Launch, words: list[str]) -> None:
    if words[:1] == ["-m"] and len(words) > 1:
        launch.module, words = True, words[1:]
    if words:
        launch.program, launch.args = words[0], words[1:]


def _container(words: list[str]) -> tuple[str, str | None, list[str], list[str]]:
    """``apptainer exec [options] IMAGE rest`` (singularity, ``docker|podman run``, ``shifter
    --image=IMAGE``, ``enroot start``) -> (runtime, IMAGE, options, rest); other words as they are."""
    runtime = words[0].rsplit("/", 1)[-1] if words else ""
    verbs = {
        "apptainer": ("exec", "run"),
        "singularity": ("exec", "run"),
        "docker": ("run",),
        "podman": ("run",),
        "enroot": ("start",),
    }
    none: tuple[str, None, list[str], list[str]] = ("", None, [], words)
    if runtime == "shifter":
        at, image = 1, None
        while at < len(words) and words[at].startswith("-"):
            flag, equals, value = words[at].partition("=")
            if flag == "--image":
                image = value if equals else (words[at + 1] if at + 1 < len(words) else None)
            at += 1 if equals or flag in SHIFTER_BARE else 2
        return (runtime, image, words[1:at], words[at:]) if image and at < len(words) else none
    if len(words) < 3 or words[1] not in verbs.get(runtime, ()):
        return none
    bare = {"docker": RUN_BARE, "podman": RUN_BARE, "enroot": ENROOT_START_BARE}.get(runtime, CONTAINER_BARE)
    at = 2
    while at < len(words) and words[at].startswith("-"):
        alone = "=" in words[at] or words[at] in bare or (words[at][:2] == "-B" and len(words[at]) > 2)
        if words[at] == "--rootfs":  # podman's folder image
            return (runtime, words[at + 1], words[2:at], words[at + 2 :]) if at + 2 < len(words) else none
        at += 1 if alone else 2
    return (runtime, words[at], words[2:at], words[at + 1 :]) if at < len(words) else none


def _srun_options(words: list[str]) -> tuple[list[tuple[str, str | None]], list[str]]:
    options: list[tuple[str, str | None]] = []
    at = 0
    variable: tuple[int, int] | None = None  # (option index, word index) of the first `$VAR` taken as options
    while at < len(words) and (words[at].startswith("-") or _variable_options(words, at)):
        word = words[at]
        if word.startswith("$"):
            variable = (len(options), at) if variable is None else variable
            options.append((word, None))
            at += 1
            continue
        if word.startswith("--"):
            flag, equals, value = word[2:].partition("=")
            if equals or flag in SRUN_BARE or flag == "kill-on-bad-exit":
                options.append((flag, value if equals else None))
                at += 1
                continue
            options.append((flag, words[at + 1] if at + 1 < len(words) else None))
            at += 2
            continue
        letter = word[1:2]
        if letter in SRUN_SHORT_VALUE:
            value = word[2:] or (words[at + 1] if at + 1 < len(words) else "")
            options.append((letter, value))
            at += 1 if word[2:] else 2
        else:
            options.append((word[1:], None))
            at += 1
    if at >= len(words) and variable is not None:  # `srun $BIN -x`: nothing after it, so $BIN is the program
        return options[: variable[0]], words[variable[1] :]
    return options, words[at:]


def _variable_options(words: list[str], at: int) -> bool:
    """``srun "${ARGS[@]}" --mpi=pmix ...``, ``srun ${AUTO_RESUME} -l ...``: a variable (or array)
    before more options is taken as srun options only the shell knows, not as the program."""
    return bool(OPTIONS_VARIABLE.fullmatch(words[at])) and at + 1 < len(words) and words[at + 1].startswith("-")


def _env_prefix(words: list[str]) -> tuple[dict[str, str], list[str]]:
    env: dict[str, str] = {}
    at = 0
    while at < len(words) and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[at]):
        name, _, value = words[at].partition("=")
        env[name] = value
        at += 1
    return env, words[at:]


def _without_redirections(words: list[str]) -> tuple[list[str], list[str]]:
    kept, redirections, at = [], [], 0
    while at < len(words):
        # 2>&1, 2>err: shlex keeps no spacing, so a number before >& (or 2 before >) is taken as the fd
        fd = at + 1 < len(words) and (words[at + 1] == ">&" or words[at] == "2" and words[at + 1] in (">", ">>"))
        if words[at].isdigit() and fd:
            redirections.append(" ".join(words[at : at + 3]))
            at += 3
        elif is_redirection(words[at]):
            redirections.append(" ".join(words[at : at + 2]))
            at += 2
        else:
            kept.append(words[at])
            at += 1
    return kept, redirections


def has_computed(words: list[str]) -> bool:
    return any(COMPUTED in word for word in words)

"""Which of a batch script's commands is its launch (``clusterkit import``): the one that starts the
heaviest work, read from what it starts - a launcher (torchrun, DeepSpeed, accelerate, mpirun, a
python per task) before a program of the user's under srun, and never a utility step (``srun
hostname``, ``nvidia-smi``, ``echo``, a container import with ``true``). The other steps that
start real work stay hook lines, and are listed: a recipe has one launch."""

from __future__ import annotations

from clusterkit.load.script_launch import Launch, parse_launch
from clusterkit.load.script_text import Command, Unmapped, split_commands, words_of

# Programs a script runs as a step around its work, not as the work: probes, cleanups, echoes.
UTILITIES = frozenset(
    "hostname nvidia-smi rocm-smi echo printf true false : ibv_devinfo ibstat env printenv date sleep rm mkdir "
    "cat ls sync enroot dd unsquashfs df free uptime which id scontrol uname nproc lscpu numactl tee touch cp mv "
    "ln chmod pwd wait kill pkill [ [[ test".split()
)
KEYWORDS = frozenset("if then else elif fi do done ! { } ( )".split())
COMMAND, LAUNCHER = 1, 2  # the work a command starts: a program of the user's, a launcher


def launch_index(commands: list[Command]) -> int | None:
    """The launch: the last command that starts a launcher, else the last srun of a program that
    is no utility; None where no command starts work."""
    work = [_work(c.words) for c in commands]
    srun = [i for i, c in enumerate(commands) if work[i] and _under_srun(c.words)]
    # A python command in the batch shell with an srun line after it is a helper run once, not
    # the launch (BLOOM's tr11-176B-ml.slurm: its srun launch reads the launcher from variables).
    found = [
        i
        for i, c in enumerate(commands)
        if work[i] and not (i not in srun and srun and srun[-1] > i and _batch_python(c.words))
    ]
    return max(found, key=lambda i: (work[i], i)) if found else None


def other_launches(commands: list[Command], chosen: int | None) -> list[Unmapped]:
    """The steps beside the launch that start real work under srun or a launcher: kept as hook
    lines, and listed (a recipe has one launch)."""
    if chosen is None:
        return []
    listed = []
    for index, command in enumerate(commands):
        if (
            index != chosen
            and _work(command.words)
            and (_under_srun(command.words) or not _batch_python(command.words))
        ):
            why = f"another step that starts work (kept as a hook line; line {commands[chosen].line} is the launch)"
            listed.append(Unmapped(command.line, command.text, why, "a recipe of its own for this step"))
    return listed


def _launches(words: list[str]) -> list[Launch]:
    return [launch for part in split_commands(words) if (launch := parse_launch(0, part)) is not None]


def _work(words: list[str]) -> int:
    """What a command starts: 0 nothing or a utility, COMMAND, LAUNCHER."""
    return max(
        (COMMAND if launch.launcher == "command" else LAUNCHER for launch in _launches(words) if not _utility(launch)),
        default=0,
    )


def _utility(launch: Launch) -> bool:
    """Whether every program a launch runs is a utility (``bash -c 'if [[ ... ]]; then enroot
    remove ...; fi'``: the test, enroot, and the keywords around them)."""
    parts = [[launch.program, *launch.args], *(words_of(text) or [text] for text in launch.beside)]
    if launch.program.rsplit("/", 1)[-1] in ("bash", "sh") and launch.args[:1] == ["-c"] and len(launch.args) > 1:
        parts = split_commands(words_of(launch.args[1]) or [])  # mpirun bash -c '...'
    programs = [_program(part) for part in parts]
    return all(program in UTILITIES for program in programs if program)


def _program(words: list[str]) -> str:
    """The program a command's words start, after shell keywords; "" for keywords alone."""
    rest = [word for word in words if word not in KEYWORDS] if words[:1] and words[0] in KEYWORDS else words
    return rest[0].rsplit("/", 1)[-1] if rest else ""


def _under_srun(words: list[str]) -> bool:
    return any(part[:1] == ["srun"] for part in split_commands(words))


def _batch_python(words: list[str]) -> bool:
    launch = parse_launch(0, split_commands(words)[-1])
    return launch is not None and launch.launcher == "python" and not launch.srun and not _under_srun(words)

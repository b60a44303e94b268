"""The examples that end ``clusterkit --help`` and each ``clusterkit COMMAND --help``: one table,
applied to the parser once every command group has registered its commands, so the groups need
not know of it. tests/test_help_examples.py parses every line with the real parser and checks the
files it names exist, so an example cannot outlive the option or the recipe it shows."""

from __future__ import annotations

import argparse

HEADING = "examples:"

TOP_LEVEL = (
    "clusterkit validate recipes/                           # every recipe in a folder",
    "clusterkit plan recipes/llama-7b-zero3-ib.yaml         # memory per GPU, the best layouts",
    "clusterkit submit recipes/tiny-gpt2-cpu.yaml --follow",
    "clusterkit ls",
)
TOP_LEVEL_NOTE = "Each command's --help ends with examples of its own."

EXAMPLES: dict[str, tuple[str, ...]] = {
    "validate": (
        "clusterkit validate recipes/llama-7b-zero3-ib.yaml",
        "clusterkit validate recipes/ recipes/ported/              # every recipe in the folders",
        "clusterkit validate -q recipes/tiny-gpt2-cpu.yaml --set resources.nodes=4",
    ),
    "import": (
        "clusterkit import job.sbatch > job.yaml                # the recipe; what was not mapped on stderr",
        "clusterkit import tests/data/import/mle-torchrun.sbatch --cluster recipes/ported/clusters/xyz-cluster.yaml",
        "clusterkit import job.sbatch --json                    # the not-mapped list and the differences",
    ),
    "new": (
        "clusterkit new --script train.py --nodes 2 --gpus 8 --cluster infiniband-h100 > train.yaml",
        "clusterkit new --trainer gpt2                          # the built-in Trainer, on stdout",
        "clusterkit new --trainer llama --zero3 --nodes 4 > llama.yaml",
    ),
    "render": (
        "clusterkit render recipes/tiny-gpt2-cpu.yaml -o tiny-job   # then read tiny-job/job.sbatch",
        "clusterkit render recipes/llama-7b-zero3-ib.yaml --set resources.nodes=4 --set resources.time=120",
        "clusterkit render recipes/script-site-hooks.yaml -o job -- --lr 3e-4   # the script's arguments, in plan.json",
    ),
    "plan": (
        "clusterkit plan recipes/llama-7b-zero3-ib.yaml",
        "clusterkit plan recipes/llama-1b-efa.yaml --top 3 --json",
        "clusterkit plan recipes/llama-7b-zero3-ib.yaml --global-batch 1024 --apply   # writes *.planned.yaml",
    ),
    "prefetch": (
        "clusterkit prefetch recipes/gpt2-offline.yaml          # on the login node, before submitting",
        "clusterkit prefetch recipes/gpt2-offline.yaml --json",
    ),
    "schema": (
        "clusterkit schema > recipe.schema.json   # point your editor's YAML schema setting at it",
        "clusterkit schema | jq '.\"$defs\".Resources.properties.time'   # what one field takes",
        "clusterkit schema --profile > profile.schema.json   # the same for cluster profiles",
    ),
    "submit": (
        "clusterkit submit recipes/tiny-gpt2-cpu.yaml --follow",
        "clusterkit submit recipes/tiny-gpt2-cpu.yaml --test-only   # when would it start? queues nothing",
        "clusterkit submit --resume runs/llama-7b-zero3/4242 --set resources.time=2-00:00:00",
        "clusterkit submit recipes/script-site-hooks.yaml --dry-run -- --lr 3e-4   # after --: the script's arguments",
    ),
    "sweep": (
        "clusterkit sweep recipes/tiny-gpt2-cpu.yaml --grid task.trainer.args.learning_rate=1e-3,3e-4 --follow",
        "clusterkit sweep recipes/tiny-gpt2-cpu.yaml --grid parallelism.micro_batch_size=2,4 --max-parallel 1 --dry-run",
    ),
    "preflight": (
        "clusterkit preflight recipes/llama-7b-zero3-ib.yaml",
        "clusterkit preflight recipes/tiny-gpt2-cpu.yaml --executor local",
    ),
    "bench": (
        "clusterkit bench recipes/tiny-gpt2-cpu.yaml --nodes 1,2 --executor local",
        "clusterkit bench recipes/llama-1b-efa.yaml --nodes 1,2,4 --steps 50 -o bench-1b",
    ),
    "gpus": (
        "clusterkit gpus                                   # every partition: GPUs free and in all",
        "clusterkit gpus recipes/tiny-gpt2-cpu.yaml        # where its job could start now, where never",
        "clusterkit gpus --cluster dev --json",
    ),
    "status": (
        "clusterkit status                    # the recent runs",
        "clusterkit status 4242 --json",
        "clusterkit status runs/tiny-gpt2/4242 --csv   # a sweep's points, one row each",
    ),
    "ls": (
        "clusterkit ls",
        "clusterkit ls --runs-dir /shared/runs --limit 50",
        "clusterkit ls --cluster aws-efa      # the runs on that cluster's login node",
    ),
    "logs": (
        "clusterkit logs 4242 -f",
        "clusterkit logs 4242 --rank 3",
    ),
    "cancel": (
        "clusterkit cancel 4242",
        "clusterkit cancel runs/llama-7b-zero3/4242",
    ),
    "report": (
        "clusterkit report 4242               # queue, start-up, training, checkpoints, time lost; MFU",
        "clusterkit report runs/tiny-gpt2/4242 --json",
        "clusterkit report 4300 --csv         # a sweep: one row per point",
    ),
    "diff": (
        "clusterkit diff 4242 4250            # recipe, profile, env, code, nodes, loss at equal steps",
        "clusterkit diff runs/tiny-gpt2/4242 runs/tiny-gpt2/4250 --json",
    ),
    "stacks": (
        "clusterkit stacks 4242               # every rank, grouped: who waits where, the odd ones named",
        "clusterkit stacks 4242 --rank 3      # rank 3's threads (and its data-loader workers)",
        "clusterkit stacks 4242 --node node2 --json",
    ),
    "exec": (
        "clusterkit exec 4242 -- nvidia-smi                  # on node 0, the batch host",
        "clusterkit exec 4242 --rank 5 -- py-spy dump --pid 1234",
        "clusterkit exec 4242 --node node17 -- df -h /dev/shm",
    ),
    "shell": (
        "clusterkit shell 4242",
        "clusterkit shell 4242 --node 1",
    ),
    "top": (
        "clusterkit top                       # the recent runs still going, refreshed every 5 s",
        "clusterkit top 4300 --interval 10    # a sweep's tasks (job id, run directory or name)",
        "clusterkit top --all --once --json   # one JSON line per run, for tools",
    ),
    "watch": (
        "clusterkit watch --all                # in tmux on the login node: every run not completed or cancelled",
        "clusterkit watch 4242 4300 --interval 30",
        "clusterkit watch --all --once --json  # from cron: one pass, one JSON line per event",
    ),
    "plot": (
        "clusterkit plot 4242                 # runs/tiny-gpt2/4242/curves.png, and in the terminal without a display",
        "clusterkit plot 4300 -o sweep.png    # a sweep: one line per point",
        "clusterkit plot 4242 4243 --terminal",
        "clusterkit plot 4300_1 --json",
    ),
    "export": (
        "clusterkit export runs/tiny-gpt2/4242 -o tiny-gpt2-hf",
        "clusterkit export runs/llama-7b-zero3/4242 --checkpoint runs/llama-7b-zero3/4242/checkpoints/checkpoint-1000",
    ),
    "sync": (
        "clusterkit sync runs/tiny-gpt2/4242              # wandb sync of its offline runs",
        "clusterkit sync 4242 --dry-run                   # what wandb would upload",
    ),
    "profile": (
        "clusterkit profile init my-site                     # on the login node: ~/.config/clusterkit/clusters/my-site.yaml",
        "clusterkit profile init my-site-a100 --partition a100 --json",
        "clusterkit profile init site-b --login login.site-b.org --json   # asked there over SSH",
    ),
    "config": (
        "clusterkit config                     # every setting, its value and where it came from",
        "clusterkit config recipes/tiny-gpt2-cpu.yaml --cluster dev --json",
    ),
    "completion": (
        "clusterkit completion bash > ~/.local/share/bash-completion/completions/clusterkit",
        "clusterkit completion zsh > ~/.zfunc/_clusterkit",
        "clusterkit completion fish > ~/.config/fish/completions/clusterkit.fish",
    ),
    "doctor": (
        "clusterkit doctor",
        "clusterkit doctor --json",
        "srun --nodes 2 --ntasks-per-node 1 clusterkit doctor --in-job   # inside an allocation",
    ),
}


class ExamplesFormatter(argparse.HelpFormatter):
    """argparse's own formatter, but an examples block keeps its lines as written."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if text.startswith(HEADING):
            return "".join(indent + line for line in text.splitlines(keepends=True))
        return super()._fill_text(text, width, indent)


def examples_block(lines: tuple[str, ...], note: str = "") -> str:
    return "\n".join((HEADING, *(f"  {line}" for line in lines), *(["", note] if note else ())))


def add_examples(parser: argparse.ArgumentParser, commands: argparse._SubParsersAction) -> None:
    """Examples to the top-level help and to each command's (a command missing from the table
    gets none, and the test says so)."""
    for command_parser, lines, note in (
        (parser, TOP_LEVEL, TOP_LEVEL_NOTE),
        *((commands.choices[name], EXAMPLES.get(name), "") for name in commands.choices),
    ):
        if lines:
            command_parser.epilog = examples_block(lines, note)
            if command_parser.formatter_class is argparse.HelpFormatter:
                command_parser.formatter_class = ExamplesFormatter

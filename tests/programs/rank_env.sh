#!/bin/sh
# The same as rank_env.c, as a shell script run directly (its #! line): no Python in front of it.
set -eu
mkdir -p -- "$1"
out="$1/rank-$RANK.txt"
shift
{
    for name in RANK LOCAL_RANK WORLD_SIZE LOCAL_WORLD_SIZE NODE_RANK MASTER_ADDR MASTER_PORT SLURM_PROCID \
        SLURM_LOCALID SLURM_NODEID SLURM_NTASKS SLURM_JOB_ID RUN_DIR; do
        eval "printf '%s=%s\n' \"\$name\" \"\${$name-}\""
    done
    printf 'exe=%s\npid=%s\n' "$(readlink /proc/$$/exe)" "$$"
    for arg in "$@"; do printf 'arg=%s\n' "$arg"; done
    printf 'parent=%s\n' "$(tr '\0' ' ' < "/proc/$PPID/cmdline")"
    printf 'sigign=%s\n' "$(sed -n 's/^SigIgn:\t//p' /proc/self/status)"
} > "$out"
printf 'rank_env: rank %s of %s\n' "$RANK" "$WORLD_SIZE"

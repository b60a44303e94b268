#!/bin/sh
# A front end that is itself the launcher (run once in the batch shell): records the contract it got,
# then starts every rank with an srun of its own, each writing who and where it is.
set -eu
{
    for name in MASTER_ADDR MASTER_PORT NNODES GPUS_PER_NODE WORLD_SIZE CLUSTERKIT_HOSTFILE RUN_DIR RANK NODE_RANK; do
        eval "printf '%s=%s\n' \"\$name\" \"\${$name-unset}\""
    done
    sed 's/^/hostfile=/' "$CLUSTERKIT_HOSTFILE"
    for arg in "$@"; do printf 'arg=%s\n' "$arg"; done
} > "$RUN_DIR/front_end.txt"
exec srun --nodes="$NNODES" --ntasks-per-node="$GPUS_PER_NODE" \
    sh -c 'echo "$SLURM_PROCID $SLURMD_NODENAME $MASTER_ADDR:$MASTER_PORT" > "$RUN_DIR/rank-$SLURM_PROCID"'

"""Which long options sbatch and srun take, for checking ``resources.extra_sbatch`` and ``srun.extra``
before anything is queued (sbatch rejects an unknown ``#SBATCH`` directive only at submit time).

Read from ``sbatch --help``/``srun --help`` of SLURM 22.05 and the sbatch man pages up to 24.05
(options added since: prefer, extra, oom-kill-step, segment, tres-bind). A site's SPANK plugins add
their own (pyxis: container-image, ...): an option in neither list is a warning, not an error.
"""

from __future__ import annotations

SBATCH_OPTIONS = frozenset(
    """
account acctg-freq array batch bb bbf begin chdir cluster-constraint clusters comment constraint container
container-id contiguous core-spec cores-per-socket cpu-freq cpus-per-gpu cpus-per-task deadline delay-boot
dependency distribution error exclude exclusive export export-file extra extra-node-info get-user-env gid
gpu-bind gpu-freq gpus gpus-per-node gpus-per-socket gpus-per-task gres gres-flags hint hold ignore-pbs input
job-name kill-on-invalid-dep licenses mail-type mail-user mcs-label mem mem-bind mem-per-cpu mem-per-gpu
mincpus network nice no-kill no-requeue nodefile nodelist nodes ntasks ntasks-per-core ntasks-per-gpu
ntasks-per-node ntasks-per-socket oom-kill-step open-mode output overcommit oversubscribe parsable partition
power prefer priority profile propagate qos quiet reboot requeue reservation segment signal sockets-per-node
spread-job switches test-only thread-spec threads-per-core time time-min tmp tres-bind tres-per-task uid
usage use-min-nodes verbose version wait wait-all-nodes wckey wrap
""".split()
)

# srun's own options that sbatch does not take: in extra_sbatch they are refused, pointing to `srun:`.
SRUN_ONLY_OPTIONS = frozenset(
    """
bcast bcast-exclude compress cpu-bind disable-status epilog exact het-group immediate jobid kill-on-bad-exit
label mpi multi-prog no-allocate overlap preserve-env prolog pty quit-on-interrupt relative resv-ports
send-libs slurmd-debug task-epilog task-prolog threads unbuffered
""".split()
)

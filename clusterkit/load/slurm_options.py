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

# srun's long options: every entry of srun(1) of SLURM 22.05 (hold from its --help), and those added
# since up to 24.05 (container-id, external-launcher, extra, oom-kill-step, segment, tres-bind,
# tres-per-task). srun.extra is checked against this list.
SRUN_OPTIONS = frozenset(
    """
accel-bind account acctg-freq bb bbf bcast bcast-exclude begin chdir cluster-constraint clusters comment compress
constraint container container-id contiguous core-spec cores-per-socket cpu-bind cpu-freq cpus-per-gpu
cpus-per-task deadline delay-boot dependency disable-status distribution epilog error exact exclude exclusive
export external-launcher extra extra-node-info gid gpu-bind gpu-freq gpus gpus-per-node gpus-per-socket
gpus-per-task gres gres-flags het-group hint hold immediate input job-name jobid kill-on-bad-exit label licenses
mail-type mail-user mcs-label mem mem-bind mem-per-cpu mem-per-gpu mincpus mpi msg-timeout multi-prog network
nice no-allocate no-kill nodefile nodelist nodes ntasks ntasks-per-core ntasks-per-gpu ntasks-per-node
ntasks-per-socket oom-kill-step open-mode output overcommit overlap oversubscribe partition power prefer
preserve-env priority profile prolog propagate pty qos quiet quit-on-interrupt reboot relative reservation
resv-ports segment send-libs signal slurmd-debug sockets-per-node spread-job switches task-epilog task-prolog
test-only thread-spec threads threads-per-core time time-min tmp tres-bind tres-per-task uid unbuffered usage
use-min-nodes verbose version wait wckey x11
""".split()
)
# srun's own options that sbatch does not take: in extra_sbatch they are refused, pointing to `srun:`.
SRUN_ONLY_OPTIONS = SRUN_OPTIONS - SBATCH_OPTIONS

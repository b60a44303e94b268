"""The job's own behaviour, in Python: what runs in the allocation around the ranks.

clusterkit renders a launch plan (``plan.json``, :mod:`.plan`) and copies this package into the run
directory; the batch script sets up the environment and then runs ``python3 <dir>/supervisor
batch plan.json``. From there :mod:`.batch` does what a multi-node job needs (the hostfile and rendezvous
port, hooks, the preflight, a service and its readiness, the launch step with the preemption signal
passed on, the exit code, requeue and retries, the secrets file's end) against a :mod:`.environment`
(SLURM's or the local executor's), and :mod:`.node` runs on every node or task around the launcher.

Standard library only, and Python 3.8 or newer (``MIN_PYTHON``): it runs on the cluster's nodes,
with their interpreter, beside whatever the job itself uses; nothing here imports clusterkit.
"""

MIN_PYTHON = (3, 8)

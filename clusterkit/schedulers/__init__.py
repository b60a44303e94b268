"""One Scheduler interface (api.py) and its adapters, registered by name: slurm (local or over SSH, one code path), local."""

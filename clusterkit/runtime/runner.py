"""``python -m clusterkit.runtime.runner RUN_DIR/job.json`` — what every rank of a task.trainer job runs."""

import argparse
from pathlib import Path

from torch.distributed.elastic.multiprocessing.errors import record

from clusterkit.runtime.rank_exit import finish
from clusterkit.runtime.train import main
from clusterkit.spec.layout import JOB_JSON

if __name__ == "__main__":  # run as a module on every rank; importing it starts nothing
    parser = argparse.ArgumentParser(prog="python -m clusterkit.runtime.runner")
    parser.add_argument("job_file", type=Path, help=f"the {JOB_JSON} of the run directory")
    # The DeepSpeed launcher appends --local_rank; LOCAL_RANK in the environment says the same.
    parser.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)
    # record: under torchrun, a failing rank writes its traceback to an error file that
    # `clusterkit status` reads to name the first failing rank.
    finish(record(main)(parser.parse_args().job_file))

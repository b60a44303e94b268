"""``python -m clusterkit.runner RUN_DIR/job.json`` — what every rank of a task.trainer job runs."""

import argparse
from pathlib import Path

from torch.distributed.elastic.multiprocessing.errors import record

from clusterkit.run_layout import JOB_JSON
from clusterkit.runner.rank_exit import finish
from clusterkit.runner.train import main

parser = argparse.ArgumentParser(prog="python -m clusterkit.runner")
parser.add_argument("job_file", type=Path, help=f"the {JOB_JSON} the batch script wrote into the run directory")
# The DeepSpeed launcher appends --local_rank; LOCAL_RANK in the environment says the same.
parser.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)
# record: under torchrun, a failing rank writes its traceback to an error file that
# `clusterkit status` reads to name the first failing rank.
finish(record(main)(parser.parse_args().job_file))

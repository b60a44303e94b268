"""What ``clusterkit report`` and ``clusterkit diff`` read of a run: its files (through the adapter's
``run_file``, so a run on a login node is read there), sacct's rows for each of its jobs, the bench
tables beside it and the model's size. Every file is read bounded; one that is missing, damaged, no
regular file or too large is left empty and its problem kept (the figures it feeds are "n/a" with
that reason), so a damaged run still gets a report and never a traceback."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from clusterkit.diagnose.run_report import BenchTable, RunFacts
from clusterkit.errors import ExternalError
from clusterkit.runs.logs import METRICS_LIMIT, Readable, read_run_file
from clusterkit.runs.record import RunRecord, metric_records
from clusterkit.schedulers.host import Host
from clusterkit.schedulers.slurm_accounting import job_accounting
from clusterkit.spec.bounded_read import CONFIG_LIMIT, InputFileError, read_bounded
from clusterkit.spec.layout import HANG_RECORD, JOB_JSON, METRICS, RESTARTS, RETRIES
from clusterkit.spec.resolved import JobFile, decode_job_file

RunFile = Callable[[RunRecord, str], Readable]  # the adapter's run_file
BENCH_TABLES = "bench-*/bench.json"  # where `clusterkit bench` writes by default: beside the run's directory
_JOB_ID = re.compile(r"^[0-9A-Za-z_.-]+$")  # as run.json's: a retry's id goes into sacct's --jobs


def read_text(run_file: RunFile, record: RunRecord, name: str, limit: int, problems: dict[str, str]) -> str | None:
    """The file's text, or None with why in ``problems[name]``."""
    try:
        return read_run_file(run_file(record, name), limit, f"the run's {name}").decode("utf-8", "replace")
    except FileNotFoundError:
        problems[name] = f"no {name} in the run directory"
    except InputFileError as exc:
        problems[name] = f"{name}: {exc.problem}"
    except (OSError, ExternalError) as exc:  # unreadable here, or the login node did not answer
        problems[name] = f"{name}: {getattr(exc, 'strerror', None) or exc}"
    return None


def read_job(run_file: RunFile, record: RunRecord, problems: dict[str, str]) -> JobFile | None:
    text = read_text(run_file, record, JOB_JSON, CONFIG_LIMIT, problems)
    if text is None:
        return None
    try:
        return decode_job_file(text)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        problems[JOB_JSON] = f"{JOB_JSON}: not a clusterkit job file ({exc})"
        return None


def gather(record: RunRecord, run_file: RunFile, host: Host | None, now: float | None = None) -> RunFacts:
    """Everything the report needs of one run (not an array: each of its tasks is one of these).
    ``host``: where sacct runs (None: the local executor, which has no accounting)."""
    problems: dict[str, str] = {}
    job = read_job(run_file, record, problems)

    def lines(name: str) -> list[dict[str, Any]]:
        text = read_text(run_file, record, name, METRICS_LIMIT, problems)
        return metric_records(text) if text is not None else []

    metrics = lines(METRICS)
    retries = lines(RETRIES)
    restarts = lines(RESTARTS)
    problems.pop(RETRIES, None)  # no retries, no restarts: the usual case
    problems.pop(RESTARTS, None)
    hang = None
    text = read_text(run_file, record, HANG_RECORD, CONFIG_LIMIT, {})
    if text is not None:
        try:
            found = json.loads(text)
            hang = found if isinstance(found, dict) else None
        except ValueError:
            problems[HANG_RECORD] = f"{HANG_RECORD}: not JSON"
    accounting = None
    if host is not None:
        job_ids = [record.job_id, *(str(r["job_id"]) for r in retries if _JOB_ID.match(str(r.get("job_id", ""))))]
        accounting = job_accounting(host, job_ids)
        if isinstance(accounting, list):  # only this run's jobs, whatever sacct added
            # (a chain's record names its array: sacct answers with every link, <array id>_<index>)
            accounting = [row for row in accounting if row.job_id in job_ids or row.job_id.split("_")[0] in job_ids]
    params = model_params(job, problems)
    return RunFacts(
        record=record,
        job=job,
        metrics=metrics,
        retries=retries,
        restarts=restarts,
        hang=hang,
        accounting=accounting,
        bench=bench_tables(record) if record.scheduler != "ssh" else [],
        model_params=params,
        problems=problems,
        now=time.time() if now is None else now,
    )


def bench_tables(record: RunRecord) -> list[BenchTable]:
    """``clusterkit bench`` tables of the same recipe name (beside the run), newest first."""
    tables = []
    for path in sorted(record.path.parent.glob(BENCH_TABLES), reverse=True):  # bench-<YYYYmmdd-HHMMSS>
        try:
            scales = json.loads(read_bounded(path, CONFIG_LIMIT, "a bench table")).get("scales")
        except (OSError, ValueError, AttributeError, InputFileError):
            continue
        if isinstance(scales, list):
            tables.append(BenchTable(str(path), [s for s in scales if isinstance(s, dict)]))
    return tables


def model_params(job: JobFile | None, problems: dict[str, str]) -> int | None:
    """The model's parameter count as the planner computes it (estimate.modelsize), from its config
    in job.json (inline, or a config.json still readable here), else task.model_size."""
    from clusterkit.estimate.modelsize import UnknownArchitecture, model_shape

    if job is None:
        return None
    task = job.recipe.task
    config: Any = task.trainer.model.config if task.trainer else task.model_config
    if isinstance(config, str):
        path = Path(config)
        try:
            config = json.loads(read_bounded(path / "config.json" if path.is_dir() else path, CONFIG_LIMIT, "a config"))
        except (OSError, ValueError, InputFileError) as exc:
            problems["model"] = f"the model config {config} cannot be read here ({exc})"
            return None
    if isinstance(config, dict):
        try:
            return model_shape(config, task.trainer.dataset.seq_len if task.trainer else None).params
        except (UnknownArchitecture, TypeError, ValueError, KeyError) as exc:
            problems["model"] = f"the model's size is unknown: {exc}"
            return None
    if task.model_size:
        return task.model_size
    problems["model"] = "the model's size is unknown (a hub model without a config: task.model_size gives it)"
    return None

# Kept to syntax every Python 3 reads, so that an older interpreter gets the sentence below rather
# than a SyntaxError from the modules it imports.
import os
import sys

MIN_PYTHON = (3, 8)  # clusterkit.supervisor.MIN_PYTHON (not imported: that is what this checks for)

if sys.version_info < MIN_PYTHON:
    sys.stderr.write(
        "clusterkit: the job's supervisor needs Python %d.%d or newer; %s is %d.%d: set host_python in "
        "the cluster profile (or a setup line that puts a newer python3 first on PATH)\n"
        % (MIN_PYTHON + (sys.executable,) + tuple(sys.version_info[:2]))
    )
    sys.exit(1)

if not __package__:  # run as the folder copied into the run directory: `python3 <dir>/supervisor ...`
    sys.path[0] = os.path.dirname(os.path.abspath(sys.path[0]))
    from supervisor.cli import main  # noqa: E402
else:  # python -m clusterkit.supervisor (the tests)
    from .cli import main  # noqa: E402

sys.exit(main(sys.argv[1:]))

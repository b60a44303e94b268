"""On the path of the job's Python processes (the supervisor puts this folder first on PYTHONPATH):
each rank's process, and each process a rank starts, registers faulthandler on SIGWINCH, writing
the stacks of all its threads into the run directory when asked (``clusterkit stacks``, the
supervisor's watchdog); the job's other Python processes (launchers, node agents, checks) write
nothing. SIGWINCH's default action is to ignore it, so asking disturbs nothing else. Then the environment's own sitecustomize, if one is
on the path after this folder, runs as it would have.

Standard library only, and the ranks' own Python, whatever its version: plain syntax.
"""

import os
import sys


def _register():
    import faulthandler
    import signal

    folder = os.environ.get("CLUSTERKIT_STACKS_DIR")
    if not folder or not hasattr(signal, "SIGWINCH"):
        return
    # A rank's own process (RANK set) claims its name; what it starts (a data loader, a compile worker)
    # is a child of it; other processes of the job write nothing.
    if getattr(sys, "_clusterkit_stacks", None) is not None:
        return  # registered already
    child = os.environ.get("CLUSTERKIT_STACKS_CLAIMED") not in (None, "", str(os.getpid()))

    def open_file(is_child):
        name = "rank{}-node{}-pid{}{}.txt".format(
            os.environ.get("RANK", "-"), os.environ.get("SLURM_NODEID", "-"), os.getpid(), "-child" if is_child else ""
        )
        try:
            os.makedirs(folder, exist_ok=True)
            return open(os.path.join(folder, name), "a")
        except OSError:
            return None

    def register(is_child):
        out = open_file(is_child)
        if out is not None:
            faulthandler.register(signal.SIGWINCH, file=out, all_threads=True, chain=True)
            sys._clusterkit_stacks = out  # open for the process's life: faulthandler writes to its descriptor

    if not child and "RANK" not in os.environ:
        return  # a launcher, a node agent, a check: no rank's, and one file per process costs the file system
    if not child:
        os.environ["CLUSTERKIT_STACKS_CLAIMED"] = str(os.getpid())
    register(child)
    if hasattr(os, "register_at_fork"):  # a forked child writes a file of its own, not into its parent's
        os.register_at_fork(after_in_child=lambda: register(True))


def _chain():
    """Run the next sitecustomize on the path, as Python would have without this folder."""
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [entry for entry in sys.path if os.path.abspath(entry or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        sys.modules["sitecustomize"] = module
        spec.loader.exec_module(module)


def register_stacks():
    """Register, once RANK is known (``supervisor rank`` learns it after the process started)."""
    try:
        _register()
    except Exception:  # never the reason a rank does not start
        pass


sys._clusterkit_register_stacks = register_stacks  # the chained sitecustomize below replaces this module's name
register_stacks()
_chain()

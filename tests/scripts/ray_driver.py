"""launcher: ray's driver in the tests: the nodes Ray reports alive, a task run on each of them
(pinned to its node), written to <run dir>/ray-driver.json; exits with the code in argv[1]. With
argv[2] == "await-preemption": first waits for the preemption signal (ray-driver.ready once its
handler is set), and records in ray-driver.preempted how many nodes were alive when it came."""

import json
import os
import signal
import socket
import sys
import time

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy


@ray.remote(num_cpus=1)
def where() -> dict:
    context = ray.get_runtime_context()
    return {"node_id": context.get_node_id(), "ip": ray.util.get_node_ip_address(), "host": socket.gethostname()}


def raylets_of_this_run() -> int:
    """The raylets running here with this run's RUN_DIR (the tests' nodes share this machine): what
    the test looks for again once the job ended."""
    count = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline, open(f"/proc/{pid}/environ", "rb") as environ:
                ours = f"RUN_DIR={os.environ['RUN_DIR']}".encode() in environ.read().split(b"\0")
                count += ours and b"raylet" in cmdline.read().split(b"\0")[0]
        except OSError:
            continue
    return count


ray.init()  # RAY_ADDRESS, from the supervisor
alive = [node for node in ray.nodes() if node["Alive"]]
pinned = [where.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)) for n in alive]
seen = {
    "address": os.environ.get("RAY_ADDRESS"),
    "nodes": [{"node_id": n["NodeID"], "ip": n["NodeManagerAddress"], "resources": n["Resources"]} for n in alive],
    "tasks": ray.get([task.remote() for task in pinned], timeout=120),
    "raylets": raylets_of_this_run(),
}
run_dir = os.environ["RUN_DIR"]
with open(os.path.join(run_dir, "ray-driver.json"), "w") as out:
    json.dump(seen, out)
if sys.argv[2:] == ["await-preemption"]:
    came = []
    signal.signal(getattr(signal, "SIG" + os.environ["CLUSTERKIT_PREEMPT_SIGNAL"]), lambda *_: came.append(1))
    open(os.path.join(run_dir, "ray-driver.ready"), "w").close()
    deadline = time.monotonic() + 120
    while not came and time.monotonic() < deadline:
        time.sleep(0.2)
    with open(os.path.join(run_dir, "ray-driver.preempted"), "w") as out:  # the cluster outlived the signal
        out.write(str(sum(1 for node in ray.nodes() if node["Alive"])) if came else "never")
sys.exit(int(sys.argv[1]))

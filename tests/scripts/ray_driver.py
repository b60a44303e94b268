"""launcher: ray's driver in the tests: the nodes Ray reports alive, a task run on each of them
(pinned to its node), written to <run dir>/ray-driver.json; exits with the code in argv[1]."""

import json
import os
import socket
import sys

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy


@ray.remote(num_cpus=1)
def where() -> dict:
    context = ray.get_runtime_context()
    return {"node_id": context.get_node_id(), "ip": ray.util.get_node_ip_address(), "host": socket.gethostname()}


ray.init()  # RAY_ADDRESS, from the supervisor
alive = [node for node in ray.nodes() if node["Alive"]]
pinned = [where.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)) for n in alive]
seen = {
    "address": os.environ.get("RAY_ADDRESS"),
    "nodes": [{"node_id": n["NodeID"], "ip": n["NodeManagerAddress"], "resources": n["Resources"]} for n in alive],
    "tasks": ray.get([task.remote() for task in pinned], timeout=120),
}
with open(os.path.join(os.environ["RUN_DIR"], "ray-driver.json"), "w") as out:
    json.dump(seen, out)
sys.exit(int(sys.argv[1]))

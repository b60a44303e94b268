"""A heterogeneous job's component (tests/test_components.py): each of its ranks answers HTTP on
$CLUSTERKIT_COMPONENT_REWARD_PORT + its local rank with who it is, records what it was told, and
records that it was stopped when SIGTERM comes (training has ended)."""

import json
import os
import signal
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

rank = int(os.environ["RANK"])
told = {name: value for name, value in os.environ.items() if name.startswith("CLUSTERKIT_COMPONENT")}
me = {
    "rank": rank,
    "world": int(os.environ["WORLD_SIZE"]),
    "node": os.environ["SLURMD_NODENAME"],
    "master": os.environ["MASTER_ADDR"],
    "told": told,
    "extra": os.environ.get("REWARD_SETTING"),
}
run_dir = Path(os.environ["RUN_DIR"])


class Answer(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = json.dumps(me).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


server = ThreadingHTTPServer(
    ("0.0.0.0", int(told["CLUSTERKIT_COMPONENT_REWARD_PORT"]) + int(os.environ["LOCAL_RANK"])), Answer
)


def stopped(_signum: int, _frame: object) -> None:
    (run_dir / f"component-stopped-{rank}").write_text("SIGTERM\n")
    threading.Thread(target=server.shutdown).start()


signal.signal(signal.SIGTERM, stopped)
(run_dir / f"component-{rank}.json").write_text(json.dumps(me))
server.serve_forever()
sys.exit(0)

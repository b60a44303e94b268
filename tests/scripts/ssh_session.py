"""Drive one login-node session the way the SSH adapter does, for tests/test_ssh_transports.py:
``ssh_session.py PROFILE [--accept-new-host-key]`` writes, uploads, reads, lists and renames files
with hostile names, runs a command with hostile words, and prints what came back as JSON."""

import json
import sys
import tempfile
from pathlib import Path

import msgspec
import yaml

from clusterkit.schedulers.code_snapshot import take_inventory, tar_bytes
from clusterkit.schedulers.ssh import open_scheduler
from clusterkit.spec.profile import Login
from clusterkit.spec.snapshot import CodeSnapshot

HOSTILE_DIR = "dir with space/-x ~%"
HOSTILE_TEXT = "héllo\n$(touch pwned) `touch pwned2`\n"
HOSTILE_WORDS = ["a b", "$HOME", "';rm -rf .;'", "-n", "line\nbreak", "%C"]
BINARY = bytes(range(256)) * 3

login = msgspec.convert(yaml.safe_load(Path(sys.argv[1]).read_text())["login"], Login)
with open_scheduler(login, "--accept-new-host-key" in sys.argv) as scheduler:
    host = scheduler.host
    host.make_dirs(HOSTILE_DIR)
    host.write_file(f"{HOSTILE_DIR}/-f %s.txt", HOSTILE_TEXT, 0o600)
    host.write_file(f"{HOSTILE_DIR}/-f %s.txt", HOSTILE_TEXT * 2, 0o600)  # replaced whole
    with tempfile.NamedTemporaryFile() as local:
        local.write(BINARY)
        local.flush()
        host.upload(local.name, "up/binary")
    with (
        tempfile.TemporaryDirectory() as code
    ):  # a code snapshot, as the SSH adapter sends it: a tar through the session
        (Path(code) / "-x ~%").mkdir()
        (Path(code) / "-x ~%" / "run me.py").write_text("print('snapshot')\n")
        (Path(code) / "-x ~%" / "run me.py").chmod(0o750)
        (Path(code) / "link").symlink_to("-x ~%/run me.py")
        snapshot = CodeSnapshot(root=code, script="-x ~%/run me.py", git=False, exclude=[], max_mb=1)
        host.unpack(tar_bytes(take_inventory(snapshot, (Path(code) / "runs",))), "up/code with space")
    host.make_dirs("into")
    host.rename(f"{HOSTILE_DIR}/-f %s.txt", "renamed.txt")
    try:
        host.rename("renamed.txt", "into")
        onto_directory = "renamed"
    except Exception as exc:  # mv -T: never into the directory
        onto_directory = type(exc).__name__
    try:
        host.open("no such file")
        missing = "read"
    except FileNotFoundError:
        missing = "FileNotFoundError"
    print(
        json.dumps(
            {
                "workdir": host.workdir,
                "name": host.name,
                "read": host.open("renamed.txt").read().decode(),
                "binary": host.open("up/binary").read() == BINARY,
                "listing": sorted(host.listdir(HOSTILE_DIR) + host.listdir(".")),
                "words": host.run(["printf", "%s|", *HOSTILE_WORDS]).stdout,
                "exit": host.run(["sh", "-c", "echo out; echo err >&2; exit 7"]).returncode,
                "onto_directory": onto_directory,
                "missing": missing,
            }
        )
    )

"""For tests/test_secrets.py: ``ssh_write_private.py PROFILE PATH`` writes its standard input to PATH on
the login node the way submit writes a secrets file, then writes it again (which must be refused),
and prints what the second write raised."""

import sys
from pathlib import Path

import msgspec
import yaml

from clusterkit.schedulers.ssh import open_scheduler
from clusterkit.spec.profile import Login

login = msgspec.convert(yaml.safe_load(Path(sys.argv[1]).read_text())["login"], Login)
data = sys.stdin.buffer.read()
with open_scheduler(login) as scheduler:
    scheduler.host.make_dirs(str(Path(sys.argv[2]).parent))
    scheduler.host.write_private(sys.argv[2], data)
    try:
        scheduler.host.write_private(sys.argv[2], b"again")
        print("written twice")
    except Exception as exc:
        print(type(exc).__name__)

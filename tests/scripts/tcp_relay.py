"""A ProxyCommand for tests: ``tcp_relay.py HOST PORT MARKER`` creates MARKER (proof that ssh went
through it) and relays standard input and output to HOST:PORT."""

import os
import socket
import sys
import threading
from pathlib import Path

Path(sys.argv[3]).touch()
connection = socket.create_connection((sys.argv[1], int(sys.argv[2])))


def upstream() -> None:
    while data := os.read(0, 65536):
        connection.sendall(data)
    connection.shutdown(socket.SHUT_WR)


threading.Thread(target=upstream, daemon=True).start()
while data := connection.recv(65536):
    os.write(1, data)

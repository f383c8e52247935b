#!/usr/bin/env python3
"""Prints a TCP port on loopback that is free, with the next one free too (the local RADOS Gateway
takes PORT for S3 and PORT+1 for its monitor)."""
import socket

for _ in range(50):
    first = socket.socket()
    first.bind(("127.0.0.1", 0))
    port = first.getsockname()[1]
    first.close()
    second = socket.socket()
    try:
        second.bind(("127.0.0.1", port + 1))
        print(port)
        break
    except OSError:
        pass
    finally:
        second.close()
else:
    raise SystemExit("no two free ports in a row")

#!/usr/bin/env python3
"""Prints a TCP port on loopback that is free, with the next one free too (the local RADOS Gateway
takes PORT for S3 and PORT+1 for its monitor), picked from 8,000 to 9,999 (its OSD takes 6800-7300):
below the kernel's ephemeral range (32768 and up), where an outgoing connection could take a port
the kernel handed out before the server binds it, and apart from the ranges the tests pick from."""
import random
import socket


def free(port):
    probe = socket.socket()
    try:
        probe.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False
    finally:
        probe.close()


for _ in range(200):
    port = random.randrange(8000, 9998)
    if free(port) and free(port + 1):
        print(port)
        break
else:
    raise SystemExit("no two free ports in a row")

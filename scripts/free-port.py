"""Prints N free TCP port bases on 127.0.0.1 (each base and base+1 free)."""
import socket
import sys


def free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def main() -> None:
    wanted = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    found = []
    while len(found) < wanted:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port < 65000 and port not in found and free(port + 1):
            found.append(port)
    print(" ".join(map(str, found)))


main()

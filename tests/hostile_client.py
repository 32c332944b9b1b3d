#!/usr/bin/env python3
"""hostile_client.py — clients that abuse a server's connections, for tests/t_harden.sh.

  slowloris PORT N SECONDS [SRC]   open N connections (from source address SRC, default 127.0.0.2),
                                   send a request line, then one header byte every 0.3 s for SECONDS;
                                   print "refused R", "cut C" (closed by the server while trickling,
                                   with the latest time a connection was cut) and "held H" (still open
                                   at the end)
  chunked PORT BYTES WAIT          send a chunked POST whose first chunk holds BYTES bytes, then send
                                   nothing more; print the status line the server answers within WAIT
                                   seconds, or "no answer"
"""
import socket
import sys
import time


def slowloris(port, n, seconds, src):
    socks, refused = [], 0
    t0 = time.time()
    for _ in range(n):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.settimeout(2)
        try:
            s.bind((src, 0))
            s.connect(("127.0.0.1", port))
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
            socks.append(s)
        except OSError:
            refused += 1
            s.close()
    # a connection the server refused at its limit is accepted by the kernel, then closed at once
    time.sleep(0.3)
    live, last_cut, cut = [], 0.0, 0
    for s in socks:
        s.setblocking(False)
        try:
            d = s.recv(1)
            if d == b"":
                refused += 1
                s.close()
                continue
        except BlockingIOError:
            pass
        except OSError:
            refused += 1
            s.close()
            continue
        live.append(s)
    end = time.time() + seconds
    while time.time() < end and live:
        keep = []
        for s in live:
            try:
                s.send(b"a")
                try:
                    if s.recv(1) == b"":
                        raise ConnectionResetError
                except BlockingIOError:
                    pass
                keep.append(s)
            except OSError:
                cut += 1
                last_cut = time.time() - t0
                s.close()
        live = keep
        time.sleep(0.3)
    print("refused %d" % refused)
    print("cut %d %.1f" % (cut, last_cut))
    print("held %d" % len(live))
    for s in live:
        s.close()


def chunked(port, nbytes, wait):
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Transfer-Encoding: chunked\r\n\r\n")
    s.sendall(b"%x\r\n" % nbytes + b"a" * nbytes + b"\r\n")
    s.settimeout(wait)
    try:
        d = s.recv(200)
        print(d.split(b"\r\n")[0].decode("latin-1") if d else "closed")
    except OSError:
        print("no answer")
    s.close()


if __name__ == "__main__":
    if sys.argv[1] == "slowloris":
        slowloris(int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]),
                  sys.argv[5] if len(sys.argv) > 5 else "127.0.0.2")
    elif sys.argv[1] == "chunked":
        chunked(int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]))
    else:
        sys.exit("usage: hostile_client.py slowloris|chunked ...")

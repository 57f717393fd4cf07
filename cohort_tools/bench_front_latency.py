"""What the batch front adds to a lone request: p50/p95 latency at 1 request/s, straight to
an engine vs through `cohort serve`'s front, measured side by side in one run.

The engine here is a stub OpenAI server (answers at once, TCP_NODELAY) so the difference
is the front's own cost: parsing, fingerprinting, batch admission (a lone request leads
its batch and is never held), the engine adapter and the relay. Requests alternate
between the two paths, each with a fresh cohort (as at low load).

  scripts/bench-front-latency [--requests 30] [--rate 1.0]

Needs the `cohort` binary (target/release/cohort, else .cohort/bin/cohort).
"""
import argparse
import http.client
import http.server
import json
import os
import socket
import statistics
import sys
import tempfile
import threading
import time

from cohort_tools import stack


class Engine(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def setup(self):
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def _reply(self, body):
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        self._reply(b"{}")

    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self._reply(json.dumps({"choices": [{"message": {"content": "ok"}}]}).encode())

    def log_message(self, *args):
        pass


def start_engine(attempts=3):
    """The stub engine's server on a free port (another one while the port is taken)."""
    for attempt in range(1, attempts + 1):
        try:
            return http.server.ThreadingHTTPServer(("127.0.0.1", stack.free_port()), Engine)
        except OSError:
            if attempt == attempts:
                raise


def timed_post(conn, body):
    started = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", body, {"content-type": "application/json"})
    response = conn.getresponse()
    response.read()
    assert response.status == 200, response.status
    return (time.perf_counter() - started) * 1000


def connect(port):
    conn = http.client.HTTPConnection("127.0.0.1", port)
    conn.connect()
    conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return conn


def main():
    parser = argparse.ArgumentParser(prog="bench-front-latency")
    parser.add_argument("--requests", type=int, default=30)
    parser.add_argument("--rate", type=float, default=1.0)
    args = parser.parse_args()
    binary = stack.COHORT
    if not os.path.exists(binary):
        binary = os.path.join(stack.ROOT, ".cohort/bin/cohort")

    server = start_engine()
    engine_port = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    workdir = tempfile.mkdtemp(prefix="cohort-front-latency-")
    batcher, ports = stack.start_cohort(workdir, [engine_port], prefix="front-latency", replica_spec="openai+",
                                        binary=binary)
    try:
        direct, front = connect(engine_port), connect(ports["front"])
        times = {"engine directly": [], "through the front": []}
        for i in range(args.requests):
            system = f"You are assistant {i} of the Example Bank. " + "Answer politely. " * 40
            body = json.dumps({"model": "m", "max_tokens": 8, "messages": [
                {"role": "system", "content": system},
                {"role": "user", "content": "How do I reset my card PIN?"}]})
            times["engine directly"].append(timed_post(direct, body))
            times["through the front"].append(timed_post(front, body))
            time.sleep(1.0 / args.rate)
        print(f"{args.requests} requests per path at {args.rate:g} req/s, ~1.1 KB prompts")
        print(f"{'path':<20}{'p50 ms':>9}{'p95 ms':>9}")
        stats = {}
        for name, values in times.items():
            p50 = statistics.median(values)
            p95 = stack.percentile(values, 0.95)
            stats[name] = (p50, p95)
            print(f"{name:<20}{p50:>9.2f}{p95:>9.2f}")
        added = stats["through the front"][0] - stats["engine directly"][0]
        print(f"added by the front at p50: {added:.2f} ms")
    finally:
        stack.stop([batcher], grace=15)
        server.shutdown()


if __name__ == "__main__":
    sys.exit(main())

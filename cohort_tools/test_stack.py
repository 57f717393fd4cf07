"""Unit tests of the shared helpers in cohort_tools.stack: port picking (as the Rust harness
does it), the retry when a child could not bind its port, and percentiles. No servers."""
import os
import socket
import sys
import tempfile
import unittest

from cohort_tools import stack


class FreePortTests(unittest.TestCase):
    def test_ports_are_below_the_ephemeral_range_distinct_and_free(self):
        low = stack._ephemeral_low()
        ports = [stack.free_port() for _ in range(50)]
        self.assertEqual(len(set(ports)), len(ports))
        for port in ports:
            self.assertGreaterEqual(port, 10_000)
            self.assertLess(port, low)
            with socket.socket() as s:
                s.bind(("127.0.0.1", port))

    def test_a_taken_port_is_skipped(self):
        port = stack.free_port()
        low = stack._ephemeral_low()
        following = 10_000 + (port + 1 - 10_000) % (low - 10_000)
        # The next port in turn, held by a listener: free_port must pass over it.
        with socket.socket() as held:
            held.bind(("127.0.0.1", following))
            held.listen()
            self.assertNotIn(stack.free_port(), (port, following))


class PortTakenTests(unittest.TestCase):
    def setUp(self):
        self.workdir = tempfile.mkdtemp(prefix="cohort-stack-test-")
        self.addCleanup(stack.stop_all)

    def child(self, message, code):
        """A child that writes `message` to its log and exits with `code`."""
        log = os.path.join(self.workdir, "child.log")
        proc = stack.spawn([sys.executable, "-c", f"import sys; sys.stderr.write({message!r}); sys.exit({code})"], log)
        proc.wait(timeout=10)
        return proc

    def test_a_bind_failure_is_port_taken(self):
        # What `cohort serve` says when its gRPC port is taken.
        proc = self.child("Error: cannot listen for gRPC on 127.0.0.1:1\n\nCaused by:\n"
                          "    Address already in use (os error 98)", 1)
        with self.assertRaises(stack.PortTaken):
            stack.wait_http(stack.free_port(), "/", proc, "child", timeout=5)

    def test_another_failure_is_not(self):
        proc = self.child("no model", 1)
        with self.assertRaises(SystemExit) as raised:
            stack.wait_http(stack.free_port(), "/", proc, "child", timeout=5)
        self.assertNotIsInstance(raised.exception, stack.PortTaken)

    def test_on_free_ports_starts_again_then_gives_up(self):
        calls = []

        def start():
            calls.append(1)
            if len(calls) < 2:
                raise stack.PortTaken("child: a port was taken")
            return "started"

        self.assertEqual(stack.on_free_ports(start), "started")
        self.assertEqual(len(calls), 2)

        def never():
            raise stack.PortTaken("child: a port was taken")

        with self.assertRaises(stack.PortTaken):
            stack.on_free_ports(never, attempts=2)

    def test_envoy_that_cannot_bind_starts_again(self):
        # Two tries: the first config names a port a listener holds.
        held = socket.socket()
        held.bind(("127.0.0.1", stack.free_port()))
        held.listen()
        self.addCleanup(held.close)
        tries = []

        def config(admin, listen):
            tries.append((admin, listen))
            return f"port: {held.getsockname()[1] if len(tries) == 1 else listen}\n"

        fake = os.path.join(self.workdir, "envoy")
        with open(fake, "w") as f:
            # Binds the port its config names and exits; as Envoy, it says "cannot bind" when
            # the port is taken.
            f.write(f"""#!{sys.executable}
import socket, sys
config = open(sys.argv[sys.argv.index("-c") + 1]).read()
port = int(config.split()[1])
s = socket.socket()
try:
    s.bind(("127.0.0.1", port))
except OSError as e:
    sys.exit(f"cannot bind '127.0.0.1:{{port}}': {{e}}")
""")
        os.chmod(fake, 0o755)
        old = stack.ENVOY
        stack.ENVOY = fake
        self.addCleanup(setattr, stack, "ENVOY", old)
        # The second try binds, then exits without answering /ready: not PortTaken, so
        # exactly two tries are made.
        with self.assertRaises(SystemExit) as raised:
            stack.start_envoy_on_free_ports(self.workdir, "fake", config)
        self.assertNotIsInstance(raised.exception, stack.PortTaken)
        self.assertEqual(len(tries), 2)


class PercentileTests(unittest.TestCase):
    def test_nearest_rank(self):
        self.assertEqual(stack.percentile([40, 10, 30, 20], 0.5), 30)
        self.assertEqual(stack.percentile(list(range(1, 31)), 0.95), 29)
        self.assertIsNone(stack.percentile([], 0.5))

    def test_interpolated(self):
        self.assertEqual(stack.percentile([10, 20, 30, 40], 0.5, interpolate=True), 25)
        self.assertAlmostEqual(stack.percentile([10, None, 20, 30, 40], 0.9, interpolate=True), 37)


if __name__ == "__main__":
    unittest.main()

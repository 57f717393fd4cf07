"""A tiny progress bar for the peer benchmark's load client (the issue asks for a progress bar
while running).

Why not a library: a bar is a few lines, and the benchmark's packages are the routers it
measures, matplotlib and PyYAML. `Progress(total, label)` draws
`\\r[#####.....] 123/500 label` on stderr at most every `interval` seconds while stderr is a
terminal, and writes one final line on `close()` in every case (so logs and CI output get
the count without a stream of carriage returns).
"""
import sys
import time


class Progress:
    """`p = Progress(500, "envoy-rr"); p.update(); ...; p.close()`; also a context manager."""

    def __init__(self, total, label="", *, stream=None, width=30, interval=0.1):
        self.total = max(0, int(total))
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.width = width
        self.interval = interval
        self.count = 0
        self.closed = False
        self._last = None  # when the bar was last drawn (None: never)
        try:
            self.tty = self.stream.isatty()
        except (AttributeError, ValueError):
            self.tty = False

    def line(self):
        """The bar as text (no carriage return)."""
        frac = min(1.0, self.count / self.total) if self.total else 1.0
        done = int(round(frac * self.width))
        return f"[{'#' * done}{'.' * (self.width - done)}] {self.count}/{self.total} {self.label}".rstrip()

    def update(self, n=1):
        """Count n more; redraw when stderr is a terminal and `interval` has passed."""
        self.count += n
        if not self.tty or self.closed:
            return
        now = time.monotonic()
        if self._last is None or now - self._last >= self.interval:
            self._last = now
            self.stream.write("\r" + self.line())
            self.stream.flush()

    def close(self):
        """Write the final line once (with a newline), terminal or not."""
        if self.closed:
            return
        self.closed = True
        self.stream.write(("\r" if self.tty else "") + self.line() + "\n")
        self.stream.flush()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

"""The shape of `cohort serve` /metrics pages: one line per series name, with its type and
label names (values dropped), over every page given (files, or directories of them).

    scripts/metrics-shape DIR_OR_FILE... > shape.txt

Reads the Prometheus text format (0.0.4) and OpenMetrics alike: a counter family that
OpenMetrics names `x` with samples `x_total` counts as the series `x_total`, as Prometheus
stores it. Used to check that a change keeps the same names, types and labels: dump the
pages of the end-to-end tests of two builds (COHORT_METRICS_DUMP=DIR, tests/src/batcher.rs)
and diff their shapes.
"""
import os
import re
import sys

SUFFIXES = ("", "_total", "_bucket", "_sum", "_count")
SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+\S+")
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="(?:[^"\\]|\\.)*"')


def pages(paths):
    for path in paths:
        if os.path.isdir(path):
            for name in sorted(os.listdir(path)):
                yield os.path.join(path, name)
        else:
            yield path


def shape(text):
    types, series = {}, set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(None, 3)
            types[name] = kind.strip()
            continue
        m = SAMPLE.match(line)
        if not m or line.startswith("#"):
            continue
        name, labels = m.group(1), m.group(3) or ""
        keys = sorted(k for k in LABEL.findall(labels) if k != "le")
        kind = next((types[name[: len(name) - len(s)]] for s in SUFFIXES
                     if name.endswith(s) and name[: len(name) - len(s)] in types), "untyped")
        series.add(f"{name}{{{','.join(keys)}}} {kind}")
    return series


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    seen = set()
    for path in pages(sys.argv[1:]):
        with open(path, encoding="utf-8") as f:
            seen |= shape(f.read())
    for line in sorted(seen):
        print(line)


if __name__ == "__main__":
    main()

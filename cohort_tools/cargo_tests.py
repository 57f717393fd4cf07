"""Runs the workspace's test executables, built by `cargo test --no-run`, the way `cargo test`
would, but faster on a small machine (scripts/test):

- the end-to-end binary (`tests/tests/e2e`) in the foreground with more threads than cores:
  its tests wait on real processes more than they compute, and those that take the whole
  machine hold `cohort_tests::one_at_a_time`;
- every other test executable beside it, one after another, at the lowest CPU priority:
  they compute and wait on nothing, so they fill the cores the end-to-end tests leave idle.

Each executable runs in its package's directory with `CARGO_MANIFEST_DIR` and
`CARGO_PKG_NAME` set, as cargo runs it. The doc-tests are not here: `cargo test --doc` runs
them. Running the executables directly, not `cargo test -p ...`, keeps the features the
whole workspace was built with (a partial `cargo test` unifies features differently and
rebuilds).

    python -m cohort_tools.cargo_tests BUILD_JSON [--e2e-threads 4]

BUILD_JSON is the output of `cargo test --no-run --message-format=json`. Exits 1 if any
executable failed.
"""

import argparse
import json
import os
import subprocess
import sys
import threading
import time

E2E_TARGET = "e2e"


def executables(build_json):
    """(target name, package name, package directory, executable) of every test executable."""
    found = []
    with open(build_json) as f:
        for line in f:
            line = line.strip()
            if not line.startswith("{"):
                continue
            message = json.loads(line)
            if message.get("reason") != "compiler-artifact" or not message.get("executable"):
                continue
            if not message.get("profile", {}).get("test"):
                continue
            package_dir = os.path.dirname(message["manifest_path"])
            package = message["package_id"]
            name = message["target"]["name"]
            found.append((name, package, package_dir, message["executable"]))
    return found


def package_name(package_id):
    """The name in a cargo package id (`path+file:///x/tests#cohort-tests@0.1.0`, or the older
    `cohort-tests 0.1.0 (path+...)` form)."""
    if "#" in package_id:
        tail = package_id.rsplit("#", 1)[1]
        return tail.split("@", 1)[0] if "@" in tail else os.path.basename(package_id.split("#", 1)[0])
    return package_id.split(" ", 1)[0]


def run(executable, package_id, package_dir, args=(), nice=False, capture=False):
    env = dict(os.environ, CARGO_MANIFEST_DIR=package_dir, CARGO_PKG_NAME=package_name(package_id))
    return subprocess.run(
        [executable, *args],
        cwd=package_dir,
        env=env,
        preexec_fn=(lambda: os.nice(19)) if nice else None,
        stdout=subprocess.PIPE if capture else None,
        stderr=subprocess.STDOUT if capture else None,
        text=True,
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("build_json")
    parser.add_argument("--e2e-threads", type=int, default=4)
    args = parser.parse_args()

    found = executables(args.build_json)
    e2e = [x for x in found if x[0] == E2E_TARGET]
    others = [x for x in found if x[0] != E2E_TARGET]
    if not e2e:
        sys.exit(f"cargo_tests: no {E2E_TARGET} executable in {args.build_json}")

    failed = []
    outputs = []

    def run_others():
        for name, package, package_dir, exe in others:
            started = time.monotonic()
            done = run(exe, package, package_dir, nice=True, capture=True)
            took = time.monotonic() - started
            outputs.append(f"     Running {name} ({os.path.relpath(exe)}) [{took:.1f}s]\n{done.stdout}")
            if done.returncode != 0:
                failed.append(f"{name} ({package})")

    beside = threading.Thread(target=run_others)
    beside.start()
    for name, package, package_dir, exe in e2e:
        print(f"     Running {name} ({os.path.relpath(exe)}) with {args.e2e_threads} threads", flush=True)
        if run(exe, package, package_dir, args=["--test-threads", str(args.e2e_threads)]).returncode != 0:
            failed.append(f"{name} ({package})")
    beside.join()
    print("".join(outputs))
    print(f"cargo_tests: {len(found)} test executables, {len(failed)} failed")
    if failed:
        print("failed: " + ", ".join(failed))
        sys.exit(1)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""The Python harness (e2e_util.Server) gives up at once, with the reason and the server's log,
when the server exits before it is ready, instead of waiting for its deadline:
- a bad --model: the server listens, fails to load the model and exits 1 (the SERVING wait);
- an unknown option: the server exits 2 before it listens (the "listening on" wait).
The deadline given is an hour: a harness that waited for it would run into ctest's TIMEOUT (300 s)
and fail. Nothing here asserts on times; the checks are on the reported reason.
"""

import argparse
import os
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import e2e_util  # noqa: E402

AN_HOUR = 3600


def start_fails(build_dir, args):
    """The ServerExited message of Server(args), or None when the server started."""
    try:
        server = e2e_util.Server(build_dir, args, timeout=AN_HOUR)
    except e2e_util.ServerExited as e:
        return str(e)
    server.stop()
    return None


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--build-dir", required=True)
    parser.add_argument("--fixtures-dir", required=True)
    args = parser.parse_args()
    failures = []

    def expect(message, *parts):
        if message is None:
            failures.append(f"the server started; expected it to exit ({parts})")
            return
        for part in parts:
            if part not in message:
                failures.append(f"{part!r} is not in the harness's report:\n{message}")

    expect(start_fails(args.build_dir, ["--model", "/nonexistent/lmserve-model"]),
           "the server exited with code 1", "cannot serve the model", "/nonexistent/lmserve-model")
    expect(start_fails(args.build_dir, ["--model", e2e_util.fixture_model(args.fixtures_dir),
                                        "--no-such-option"]),
           "the server exited with code 2 before 'listening on", "no-such-option")
    for failure in failures:
        print("FAIL:", failure)
    print("ok" if not failures else f"{len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

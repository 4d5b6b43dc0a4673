"""Helpers for the Python end-to-end tests: start `lmserve serve` on loopback, run lmserve-cli."""

import os
import re
import signal
import socket
import subprocess
import tempfile
import time


def free_port():
    """A loopback port that was free a moment ago (for servers that cannot bind port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`lmserve serve --host 127.0.0.1 --port 0 ARGS`, its stderr in a temp file."""

    def __init__(self, build_dir, args, timeout=60):
        self.build_dir = build_dir
        self.log_file = tempfile.NamedTemporaryFile(prefix="lmserve-e2e-", suffix=".log",
                                                    delete=False)
        cmd = [os.path.join(build_dir, "bin", "lmserve"), "serve", "--host", "127.0.0.1",
               "--port", "0", "--threads", "1"] + list(args)
        self.process = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=self.log_file)
        self.port = self._wait_log(r"listening on 127\.0\.0\.1:(\d+)", timeout)
        self.metrics_port = None
        if "--metrics-port" in args:
            self.metrics_port = self._wait_log(r"metrics on http://127\.0\.0\.1:(\d+)/metrics",
                                               timeout)
        self._wait_log(r"SERVING", timeout)

    @property
    def address(self):
        return f"127.0.0.1:{self.port}"

    def log(self):
        with open(self.log_file.name, encoding="utf-8", errors="replace") as f:
            return f.read()

    def _wait_log(self, pattern, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            match = re.search(pattern, self.log())
            if match:
                return int(match.group(1)) if match.groups() else True
            if self.process.poll() is not None:
                raise RuntimeError("the server exited early:\n" + self.log())
            time.sleep(0.02)
        raise RuntimeError(f"no '{pattern}' in the server's log within {timeout} s:\n" + self.log())

    def cli(self, *args, timeout=60):
        """Runs lmserve-cli against the server; returns (exit code, stdout)."""
        cmd = [os.path.join(self.build_dir, "bin", "lmserve-cli"), args[0], "--addr",
               self.address] + list(args[1:])
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
        return done.returncode, done.stdout

    def stop(self):
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        os.unlink(self.log_file.name)


def fixture_model(fixtures_dir):
    return os.path.join(fixtures_dir, "hf-tiny", "llama-gqa")

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


class ServerExited(RuntimeError):
    """The server exited before what a wait waited for; the message ends with its log."""


class Server:
    """`lmserve serve --host 127.0.0.1 --port 0 ARGS`, its stderr in a temp file.

    Every wait polls the log and the process, with a deadline: it raises ServerExited at once when
    the server exits first, RuntimeError when the deadline passes; both messages end with the
    server's log, and the constructor leaves no process behind when it raises.
    """

    def __init__(self, build_dir, args, timeout=60, wait_serving=True):
        self.build_dir = build_dir
        self.log_file = tempfile.NamedTemporaryFile(prefix="lmserve-e2e-", suffix=".log",
                                                    delete=False)
        cmd = [os.path.join(build_dir, "bin", "lmserve"), "serve", "--host", "127.0.0.1",
               "--port", "0", "--threads", "1"] + list(args)
        self.process = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=self.log_file)
        try:
            self.port = self._wait_log(r"listening on 127\.0\.0\.1:(\d+)", timeout)
            self.http_port = None
            if "--http-port" in args:
                self.http_port = self._wait_log(
                    r"HTTP API \(OpenAI-compatible\) on https?://127\.0\.0\.1:(\d+)", timeout)
            self.metrics_port = None
            if "--metrics-port" in args:
                self.metrics_port = self._wait_log(
                    r"metrics on http://127\.0\.0\.1:(\d+)/metrics", timeout)
            if wait_serving:
                self._wait_log(r"SERVING", timeout)
        except BaseException:
            self.stop()
            raise

    @property
    def address(self):
        return f"127.0.0.1:{self.port}"

    def log(self):
        with open(self.log_file.name, encoding="utf-8", errors="replace") as f:
            return f.read()

    def exit_description(self):
        """How the server exited ("exited with code N", "was killed by signal N"), or None."""
        code = self.process.poll()
        if code is None:
            return None
        return f"exited with code {code}" if code >= 0 else f"was killed by signal {-code}"

    def _wait_log(self, pattern, timeout):
        deadline = time.monotonic() + timeout
        while True:
            match = re.search(pattern, self.log())
            if match:
                return int(match.group(1)) if match.groups() else True
            exit_description = self.exit_description()
            if exit_description is not None:
                match = re.search(pattern, self.log())  # written just before it exited?
                if match:
                    return int(match.group(1)) if match.groups() else True
                raise ServerExited(f"the server {exit_description} before '{pattern}' was in "
                                   "its log; its log:\n" + self.log())
            if time.monotonic() >= deadline:
                raise RuntimeError(f"the server is running but logged no '{pattern}' within "
                                   f"{timeout} s; its log:\n" + self.log())
            time.sleep(0.02)

    def cli(self, *args, timeout=60):
        """Runs lmserve-cli against the server; returns (exit code, stdout)."""
        cmd = [os.path.join(self.build_dir, "bin", "lmserve-cli"), args[0], "--addr",
               self.address] + list(args[1:])
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
        return done.returncode, done.stdout

    def stop(self):
        """SIGTERM, then SIGKILL after 30 s; removes the log. Safe to call twice."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log_file.close()
        if os.path.exists(self.log_file.name):
            os.unlink(self.log_file.name)


def fixture_model(fixtures_dir):
    return os.path.join(fixtures_dir, "hf-tiny", "llama-gqa")

#!/usr/bin/env python3
"""The OpenAI-compatible HTTP API driven by the official `openai` Python package (PyPI; pinned in
tests/e2e/openai-requirements.txt, installed by scripts/openai-venv.sh), on the demo model (its
tokenizer and chat template), with a bearer token:
- /v1/models lists the served model;
- chat, plain and streamed: the stream's text equals the plain answer at temperature 0, and
  stream_options.include_usage ends the stream with the same usage;
- completions, plain, streamed and echoed; n=2; logprobs (completions and chat); stop strings;
  seed reproducibility at temperature 1; return_token_ids;
- the error statuses through the SDK's exceptions: 400 naming the field, 401, 404 unknown model,
  413, 503 while draining (and a stream in flight at the end of the grace period ends with an
  error event and [DONE]); 429 and the rest in openai_http_errors_test.py;
- raw SSE framing with `curl -N` (headers, data: lines, the usage chunk, data: [DONE]);
- /tokenize and /detokenize round-trip; a client that disconnects mid-stream aborts its request
  (counted as 499, the engine's running requests back to 0).
Skips (exit 77) without the demo model or the openai package.
"""

import argparse
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import e2e_util  # noqa: E402

TOKEN = "openai-e2e-token"


def demo_model():
    path = os.environ.get("LMSERVE_DEMO_MODEL")
    if not path:
        cache = os.environ.get("LMSERVE_CACHE_DIR") or os.path.join(
            os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "lmserve")
        path = os.path.join(cache, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
    return path if os.path.exists(path) else None


def metric(text, name, labels):
    """The value of the sample of `name` whose labels include `labels`, or 0."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def wait_for(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"not within {timeout} s: {what}")


class Checks:
    def __init__(self):
        self.failures = []
        self.passed = 0

    def expect(self, condition, message):
        if condition:
            self.passed += 1
        else:
            self.failures.append(message)
            print("FAIL:", message, flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--build-dir", required=True)
    parser.add_argument("--fixtures-dir", required=True)
    args = parser.parse_args()
    try:
        import openai  # noqa: PLC0415
    except ImportError:
        print("SKIP: no openai package (scripts/openai-venv.sh installs it; run this test with "
              "its python)")
        return 77
    model = demo_model()
    if model is None:
        print("SKIP: no demo model (scripts/fetch-demo-model.sh fetches it)")
        return 77
    print("openai", openai.__version__, flush=True)
    with tempfile.NamedTemporaryFile("w", suffix=".token", delete=False) as f:
        f.write(TOKEN)
        token_file = f.name
    c = Checks()
    server = e2e_util.Server(args.build_dir, [
        "--model", model, "--kv-cache-mb", "64", "--http-port", "0", "--metrics-port", "0",
        "--auth-token-file", token_file, "--max-request-bytes", "1048576",
        "--grace-period-s", "4"], timeout=240)
    try:
        base = f"http://127.0.0.1:{server.http_port}"
        client = openai.OpenAI(base_url=base + "/v1", api_key=TOKEN, max_retries=0, timeout=240)

        models = client.models.list()
        names = [m.id for m in models.data]
        c.expect(len(names) == 1, f"/v1/models lists {names}")
        name = names[0]

        # ---- chat: plain and streamed, equal at temperature 0 ----
        messages = [{"role": "user", "content": "What is the capital of France? One sentence."}]
        plain = client.chat.completions.create(model=name, messages=messages, max_tokens=16,
                                               temperature=0)
        plain_text = plain.choices[0].message.content
        c.expect(plain.object == "chat.completion" and plain.choices[0].message.role == "assistant",
                 f"chat response shape: {plain}")
        c.expect(bool(plain_text), "chat answered nothing")
        c.expect(plain.choices[0].finish_reason in ("stop", "length"),
                 f"chat finish_reason {plain.choices[0].finish_reason}")
        c.expect(plain.usage.completion_tokens > 0 and plain.usage.total_tokens ==
                 plain.usage.prompt_tokens + plain.usage.completion_tokens,
                 f"chat usage {plain.usage}")
        stream = client.chat.completions.create(model=name, messages=messages, max_tokens=16,
                                                temperature=0, stream=True,
                                                stream_options={"include_usage": True})
        pieces, roles, finish, usage = [], [], None, None
        for chunk in stream:
            c.expect(chunk.object == "chat.completion.chunk", f"chunk object {chunk.object}")
            if chunk.usage is not None:
                usage = chunk.usage
            for choice in chunk.choices:
                if choice.delta.role:
                    roles.append(choice.delta.role)
                if choice.delta.content:
                    pieces.append(choice.delta.content)
                if choice.finish_reason:
                    finish = choice.finish_reason
        c.expect("".join(pieces) == plain_text,
                 f"streamed chat {''.join(pieces)!r} != plain {plain_text!r}")
        c.expect(roles == ["assistant"], f"stream roles {roles}")
        c.expect(finish == plain.choices[0].finish_reason, f"stream finish_reason {finish}")
        c.expect(usage is not None and usage.completion_tokens == plain.usage.completion_tokens
                 and usage.prompt_tokens == plain.usage.prompt_tokens,
                 f"stream usage {usage} vs {plain.usage}")
        c.expect(len(pieces) > 1, f"the chat stream came in {len(pieces)} piece(s)")

        # ---- completions: plain, streamed, echoed ----
        prompt = "The capital of France is"
        done = client.completions.create(model=name, prompt=prompt, max_tokens=12, temperature=0)
        text = done.choices[0].text
        c.expect(done.object == "text_completion" and text, f"completion {done}")
        streamed = "".join(ch.choices[0].text for ch in client.completions.create(
            model=name, prompt=prompt, max_tokens=12, temperature=0, stream=True)
            if ch.choices)
        c.expect(streamed == text, f"streamed completion {streamed!r} != {text!r}")
        echoed = client.completions.create(model=name, prompt=prompt, max_tokens=12,
                                           temperature=0, echo=True)
        c.expect(echoed.choices[0].text == prompt + text,
                 f"echo: {echoed.choices[0].text!r}")
        many = client.completions.create(model=name, prompt=[prompt, "One, two, three,"],
                                         max_tokens=4, temperature=0)
        c.expect([ch.index for ch in many.choices] == [0, 1] and many.choices[0].text == text[:len(
            many.choices[0].text)], f"two prompts: {many.choices}")

        # ---- n=2 ----
        two = client.completions.create(model=name, prompt=prompt, max_tokens=8, temperature=1.0,
                                        n=2, seed=7)
        c.expect(sorted(ch.index for ch in two.choices) == [0, 1], f"n=2 indices: {two.choices}")
        c.expect(two.usage.completion_tokens == 16 or all(
            ch.finish_reason == "stop" for ch in two.choices) or two.usage.completion_tokens < 16,
            f"n=2 usage {two.usage}")
        two_chat = client.chat.completions.create(model=name, messages=messages, max_tokens=4,
                                                  n=2, temperature=1.0, seed=3)
        c.expect(len(two_chat.choices) == 2, f"chat n=2: {two_chat.choices}")

        # ---- logprobs ----
        lp = client.completions.create(model=name, prompt=prompt, max_tokens=5, temperature=0,
                                       logprobs=2)
        logprobs = lp.choices[0].logprobs
        c.expect(len(logprobs.tokens) == lp.usage.completion_tokens == len(
            logprobs.token_logprobs) == len(logprobs.top_logprobs),
            f"completion logprobs lengths: {logprobs}")
        c.expect(all(v <= 0 for v in logprobs.token_logprobs), "logprobs must be <= 0")
        c.expect(all(1 <= len(top) <= 3 for top in logprobs.top_logprobs),
                 f"top_logprobs sizes {[len(t) for t in logprobs.top_logprobs]}")
        c.expect("".join(logprobs.tokens) == lp.choices[0].text,
                 f"logprob tokens {logprobs.tokens} vs {lp.choices[0].text!r}")
        clp = client.chat.completions.create(model=name, messages=messages, max_tokens=5,
                                             temperature=0, logprobs=True, top_logprobs=3)
        content = clp.choices[0].logprobs.content
        c.expect(len(content) == clp.usage.completion_tokens and all(
            len(entry.top_logprobs) == 3 and entry.logprob <= 0 for entry in content),
            f"chat logprobs: {content}")
        c.expect(content[0].top_logprobs[0].logprob >= content[0].top_logprobs[1].logprob,
                 "chat top_logprobs are most likely first")

        # ---- stop strings ----
        words = text.split()
        if len(words) >= 3:
            stop = " " + words[2]
            cut = client.completions.create(model=name, prompt=prompt, max_tokens=12,
                                            temperature=0, stop=[stop])
            c.expect(cut.choices[0].text == text[:text.index(stop)]
                     and cut.choices[0].finish_reason == "stop",
                     f"stop {stop!r}: {cut.choices[0].text!r} ({cut.choices[0].finish_reason}) "
                     f"from {text!r}")
        else:
            c.expect(False, f"the completion is too short to pick a stop string: {text!r}")

        # ---- seed reproducibility ----
        seeded = [client.completions.create(model=name, prompt=prompt, max_tokens=16,
                                            temperature=1.0, seed=1234).choices[0].text
                  for _ in range(2)]
        c.expect(seeded[0] == seeded[1], f"seed 1234 gave {seeded}")

        # ---- return_token_ids (vLLM's extension, through extra_body) ----
        ids = client.completions.create(model=name, prompt=prompt, max_tokens=6, temperature=0,
                                        extra_body={"return_token_ids": True})
        extra = ids.choices[0].model_extra or {}
        c.expect(len(extra.get("token_ids", [])) == ids.usage.completion_tokens and len(
            extra.get("prompt_token_ids", [])) == ids.usage.prompt_tokens,
            f"return_token_ids: {extra}")

        # ---- errors through the SDK ----
        try:
            client.completions.create(model=name, prompt=prompt, max_tokens=4, temperature=-1)
            c.expect(False, "temperature -1 was accepted")
        except openai.BadRequestError as e:
            c.expect(e.status_code == 400 and e.body.get("param") == "temperature",
                     f"400: {e.status_code} {e.body}")
        try:
            openai.OpenAI(base_url=base + "/v1", api_key="wrong", max_retries=0).models.list()
            c.expect(False, "a wrong key was accepted")
        except openai.AuthenticationError as e:
            c.expect(e.status_code == 401, f"401: {e.status_code}")
        try:
            client.chat.completions.create(model="no-such-model", messages=messages, max_tokens=2)
            c.expect(False, "an unknown model was accepted")
        except openai.NotFoundError as e:
            c.expect(e.status_code == 404 and e.body.get("code") == "model_not_found",
                     f"404: {e.status_code} {e.body}")
        try:
            client.completions.create(model=name, prompt="word " * 300000, max_tokens=2)
            c.expect(False, "a 1.5 MB body was accepted")
        except openai.APIStatusError as e:
            c.expect(e.status_code == 413, f"413: {e.status_code} {e.body}")
        try:
            client.chat.completions.create(
                model=name, messages=messages, max_tokens=2,
                response_format={"type": "json_schema", "json_schema": {
                    "name": "x", "schema": {"type": "number", "multipleOf": 2}}})
            c.expect(False, "a schema with an unsupported keyword was accepted")
        except openai.BadRequestError as e:
            c.expect(e.body.get("param") == "response_format" and "'multipleOf'" in e.body["message"],
                     f"response_format: {e.body}")

        # ---- raw SSE with curl -N ----
        body = json.dumps({"model": name, "prompt": prompt, "max_tokens": 5, "temperature": 0,
                           "stream": True, "stream_options": {"include_usage": True}})
        curl = subprocess.run(
            ["curl", "-sS", "-N", "-D", "-", "-H", f"Authorization: Bearer {TOKEN}",
             "-H", "Content-Type: application/json", "-d", body, base + "/v1/completions"],
            capture_output=True, timeout=120, check=False)
        head, _, sse = curl.stdout.decode("utf-8", "replace").partition("\r\n\r\n")
        c.expect(curl.returncode == 0 and head.startswith("HTTP/1.1 200"),
                 f"curl: {curl.returncode} {curl.stderr} {head}")
        c.expect(re.search(r"(?im)^content-type: text/event-stream", head) is not None,
                 f"SSE content type: {head}")
        events = sse.split("\n\n")
        c.expect(events[-1] == "" and events[-2] == "data: [DONE]",
                 f"the stream must end with 'data: [DONE]' and a blank line: {sse[-200:]!r}")
        chunks = [json.loads(e[len("data: "):]) for e in events[:-2]]
        c.expect(all(e.startswith("data: ") and "\n" not in e for e in events[:-2]),
                 "every event is one data: line")
        c.expect(chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 5,
                 f"the usage chunk: {chunks[-1]}")
        c.expect("".join(ch["choices"][0]["text"] for ch in chunks[:-1]) == text[:len(
            "".join(ch["choices"][0]["text"] for ch in chunks[:-1]))],
            "the curl stream's text starts the plain completion")

        # ---- /tokenize and /detokenize ----
        def post(path, payload):
            request = urllib.request.Request(
                base + path, data=json.dumps(payload).encode(),
                headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=60) as response:
                return json.loads(response.read())
        tokens = post("/tokenize", {"model": name, "prompt": prompt, "add_special_tokens": False})
        c.expect(tokens["count"] == len(tokens["tokens"]) > 0, f"/tokenize: {tokens}")
        back = post("/detokenize", {"model": name, "tokens": tokens["tokens"]})
        c.expect(back["prompt"] == prompt, f"/detokenize: {back}")
        chat_tokens = post("/tokenize", {"model": name, "messages": messages})
        c.expect(chat_tokens["count"] == plain.usage.prompt_tokens,
                 f"/tokenize of messages: {chat_tokens['count']} vs {plain.usage.prompt_tokens}")

        # ---- a client that goes away mid-stream aborts its request ----
        metrics_url = f"http://127.0.0.1:{server.metrics_port}/metrics"

        def scrape():
            with urllib.request.urlopen(metrics_url, timeout=30) as response:
                return response.read().decode()
        gone_before = metric(scrape(), "lmserve_http_requests_total",
                             {"route": "/v1/completions", "code": "499"})
        aborted_before = metric(scrape(), "lmserve_request_success_total",
                                {"finished_reason": "abort"})
        sock = socket.create_connection(("127.0.0.1", server.http_port), timeout=60)
        payload = json.dumps({"model": name, "prompt": prompt, "max_tokens": 1200,
                              "ignore_eos": True, "stream": True}).encode()
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                     b"application/json\r\nAuthorization: Bearer " + TOKEN.encode() +
                     b"\r\nContent-Length: " + str(len(payload)).encode() + b"\r\n\r\n" + payload)
        received = b""
        while b"data: {" not in received:
            chunk = sock.recv(4096)
            if not chunk or b"HTTP/1.1 200" not in received + chunk:
                raise AssertionError(f"the stream to abandon did not start: {received + chunk!r}")
            received += chunk
        sock.close()
        wait_for(lambda: metric(scrape(), "lmserve_http_requests_total",
                                {"route": "/v1/completions", "code": "499"}) > gone_before,
                 60, "the disconnect counted as 499")
        wait_for(lambda: metric(scrape(), "lmserve_num_requests_running", {}) == 0, 60,
                 "no request running after the disconnect")
        c.expect(metric(scrape(), "lmserve_request_success_total", {"finished_reason": "abort"})
                 > aborted_before, "the disconnected request counted as aborted")
        text_metrics = scrape()
        c.expect(metric(text_metrics, "lmserve_e2e_request_latency_seconds_count",
                        {"front_end": "http"}) > 0, "HTTP requests in the latency histograms")

        # ---- draining: 503 for new requests, the stream in flight ends with an error event ----
        conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=120)
        conn.request("POST", "/v1/completions", body=json.dumps(
            {"model": name, "prompt": prompt, "max_tokens": 1200, "ignore_eos": True,
             "stream": True}), headers={"Authorization": f"Bearer {TOKEN}"})
        response = conn.getresponse()
        first = response.readline()
        c.expect(first.startswith(b"data: {"), f"the long stream began with {first!r}")
        rest = []
        reader = threading.Thread(target=lambda: rest.append(response.read()))
        reader.start()
        server.process.send_signal(signal.SIGTERM)
        wait_for(lambda: urllib_status(base + "/health") == 503, 30, "/health 503 while draining")
        try:
            client.completions.create(model=name, prompt=prompt, max_tokens=2)
            c.expect(False, "a request was admitted while draining")
        except openai.APIStatusError as e:
            c.expect(e.status_code == 503, f"draining: {e.status_code} {e.body}")
        reader.join(timeout=120)
        tail = rest[0].decode() if rest else ""
        c.expect(tail.endswith("data: [DONE]\n\n"), f"the drained stream's end: {tail[-300:]!r}")
        c.expect('"error"' in tail and "shutting down" in tail,
                 f"the drained stream's error event: {tail[-400:]!r}")
        server.process.wait(timeout=60)
        c.expect(server.process.returncode == 0, f"exit code {server.process.returncode}")
    finally:
        log = server.log() if os.path.exists(server.log_file.name) else ""
        server.stop()
        os.unlink(token_file)
    print(f"{c.passed} checks passed")
    if c.failures:
        print("FAILED:\n  " + "\n  ".join(c.failures))
        print("server log:\n" + log[-5000:])
        return 1
    print("PASS")
    return 0


def urllib_status(url):
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return None


if __name__ == "__main__":
    sys.exit(main())

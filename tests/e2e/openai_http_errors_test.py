#!/usr/bin/env python3
"""Bad HTTP input against `lmserve serve --http-port`: each of the cases below must get its HTTP
status and an OpenAI error object whose message (and param, where a field is at fault) says what
was wrong, and the server must stay up (0 crashes: /health answers 200 after every case, and a
SIGTERM at the end drains it to exit code 0).

The server serves the tiny fixture model (no tokenizer, no chat template) with a bearer token and
a 64 KiB request limit; a second one has --max-queued-requests 0 for 429. Standard library only:
raw sockets for what no HTTP client would send.
"""

import argparse
import http.client
import json
import os
import socket
import sys
import tempfile

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import e2e_util  # noqa: E402

TOKEN = "e2e-secret-token"
MAX_REQUEST_BYTES = 65536


def request(port, method, path, body=None, headers=None, token=TOKEN):
    """One request on a fresh connection: (status, parsed JSON or raw text, headers)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    all_headers = {"Content-Type": "application/json"}
    if token is not None:
        all_headers["Authorization"] = f"Bearer {token}"
    all_headers.update(headers or {})
    if isinstance(body, (dict, list)):
        body = json.dumps(body).encode()
    elif isinstance(body, str):
        body = body.encode()
    conn.request(method, path, body=body, headers=all_headers)
    response = conn.getresponse()
    data = response.read()
    conn.close()
    try:
        parsed = json.loads(data)
    except ValueError:
        parsed = data.decode("utf-8", "replace")
    return response.status, parsed, dict(response.getheaders())


def raw(port, data):
    """Sends raw bytes, returns (status, parsed JSON body or text)."""
    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
        s.sendall(data)
        received = b""
        while True:
            try:
                chunk = s.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            received += chunk
    head, _, body = received.partition(b"\r\n\r\n")
    status = int(head.split(b" ")[1]) if head.startswith(b"HTTP/1.") else 0
    try:
        return status, json.loads(body)
    except ValueError:
        return status, body.decode("utf-8", "replace")


def completion(**fields):
    body = {"model": "llama-gqa", "prompt": [1, 2, 3], "max_tokens": 2}
    body.update(fields)
    return body


def chat(**fields):
    body = {"model": "llama-gqa", "messages": [{"role": "user", "content": "hi"}]}
    body.update(fields)
    return body


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--build-dir", required=True)
    parser.add_argument("--fixtures-dir", required=True)
    args = parser.parse_args()
    model = e2e_util.fixture_model(args.fixtures_dir)
    with tempfile.NamedTemporaryFile("w", suffix=".token", delete=False) as f:
        f.write(TOKEN + "\n")
        token_file = f.name
    failures = []
    checked = 0
    server = e2e_util.Server(args.build_dir, [
        "--model", model, "--served-model-name", "llama-gqa", "--http-port", "0",
        "--auth-token-file", token_file, "--max-request-bytes", str(MAX_REQUEST_BYTES)])
    full = None
    try:
        port = server.http_port
        big_header = "x" * 20000
        # (name, send, status, message part, param): `send` returns (status, body).
        cases = [
            ("malformed JSON", lambda: request(port, "POST", "/v1/completions", "{\"prompt\": "),
             400, "not valid JSON", "body"),
            ("JSON that is not an object",
             lambda: request(port, "POST", "/v1/completions", "[1, 2]"), 400,
             "must be a JSON object", "body"),
            ("invalid UTF-8",
             lambda: request(port, "POST", "/v1/completions",
                             b'{"prompt": "\xff\xfe", "model": "llama-gqa"}'), 400,
             "not valid JSON", "body"),
            ("nesting 1000 deep",
             lambda: request(port, "POST", "/v1/completions", "[" * 1000 + "]" * 1000), 400,
             "nested deeper", "body"),
            ("missing prompt", lambda: request(port, "POST", "/v1/completions", {"model": "llama-gqa"}),
             400, "missing", "prompt"),
            ("prompt of the wrong type",
             lambda: request(port, "POST", "/v1/completions", completion(prompt=5)), 400,
             "must be a string", "prompt"),
            ("empty prompt list",
             lambda: request(port, "POST", "/v1/completions", completion(prompt=[])), 400,
             "empty", "prompt"),
            ("token id outside the vocabulary",
             lambda: request(port, "POST", "/v1/completions", completion(prompt=[1, 5000])), 400,
             "outside the vocabulary", "prompt"),
            ("negative max_tokens",
             lambda: request(port, "POST", "/v1/completions", completion(max_tokens=-5)), 400,
             "must be >= 1", "max_tokens"),
            ("max_tokens past the context",
             lambda: request(port, "POST", "/v1/completions", completion(max_tokens=100000)), 400,
             "context length", "max_tokens"),
            ("max_tokens as a string",
             lambda: request(port, "POST", "/v1/completions", completion(max_tokens="5")), 400,
             "must be an integer, got a string", "max_tokens"),
            ("n = 0", lambda: request(port, "POST", "/v1/completions", completion(n=0)), 400,
             "must be in [1,", "n"),
            ("n too large", lambda: request(port, "POST", "/v1/completions", completion(n=1000)),
             400, "must be in [1,", "n"),
            ("negative temperature",
             lambda: request(port, "POST", "/v1/completions", completion(temperature=-1)), 400,
             "must be >= 0", "temperature"),
            ("top_p = 0", lambda: request(port, "POST", "/v1/completions", completion(top_p=0)),
             400, "must be in (0, 1]", "top_p"),
            ("top_p of the wrong type",
             lambda: request(port, "POST", "/v1/completions", completion(top_p="high")), 400,
             "must be a number", "top_p"),
            ("too many logprobs",
             lambda: request(port, "POST", "/v1/completions", completion(logprobs=50)), 400,
             "must be in [0, 20]", "logprobs"),
            ("bad logit_bias key",
             lambda: request(port, "POST", "/v1/completions", completion(logit_bias={"a": 1})),
             400, "is not a token id", "logit_bias"),
            ("seed as a string",
             lambda: request(port, "POST", "/v1/completions", completion(seed="1")), 400,
             "must be an integer", "seed"),
            ("stream_options without stream",
             lambda: request(port, "POST", "/v1/completions",
                             completion(stream_options={"include_usage": True})), 400,
             "only allowed with", "stream_options"),
            ("stop strings without a tokenizer",
             lambda: request(port, "POST", "/v1/completions", completion(stop=["x"])), 400,
             "need a tokenizer", "stop"),
            ("text prompt without a tokenizer",
             lambda: request(port, "POST", "/v1/completions", completion(prompt="hello")), 400,
             "no tokenizer", "prompt"),
            ("response_format without a tokenizer",
             lambda: request(port, "POST", "/v1/completions",
                             completion(response_format={"type": "json_object"})),
             400, "needs the model's tokenizer", "response_format"),
            ("a tool without a name", lambda: request(port, "POST", "/v1/chat/completions",
                                                      chat(tools=[{"type": "function",
                                                                   "function": {}}])),
             400, "missing", "tools[0].function.name"),
            ("a legacy function message",
             lambda: request(port, "POST", "/v1/chat/completions",
                             chat(messages=[{"role": "function", "content": "1", "name": "a"}])),
             400, "legacy", "messages[0].role"),
            ("an image part", lambda: request(port, "POST", "/v1/chat/completions", chat(
                messages=[{"role": "user", "content": [{"type": "image_url",
                                                        "image_url": {"url": "x"}}]}])),
             400, "text only", "messages[0].content[0].type"),
            ("chat without a chat template",
             lambda: request(port, "POST", "/v1/chat/completions", chat()), 400,
             "no chat template", "messages"),
            ("unknown model",
             lambda: request(port, "POST", "/v1/completions", completion(model="gpt-9")), 404,
             "does not exist", "model"),
            ("unknown route", lambda: request(port, "POST", "/v1/embeddings", {"input": "x"}), 404,
             "Invalid URL (POST /v1/embeddings)", None),
            ("GET on a POST route", lambda: request(port, "GET", "/v1/completions"), 405,
             "use POST", None),
            ("POST on /health", lambda: request(port, "POST", "/health", "{}"), 405, "use GET",
             None),
            ("no bearer token",
             lambda: request(port, "POST", "/v1/completions", completion(), token=None), 401,
             "missing 'authorization: Bearer <token>'", None),
            ("two authorization headers",
             lambda: request(port, "POST", "/v1/completions", completion(),
                             headers={"authorization": f"Bearer {TOKEN}"}), 401,
             "more than one 'authorization' header", None),
            ("a wrong bearer token",
             lambda: request(port, "POST", "/v1/completions", completion(), token="nope"), 401,
             "invalid bearer token", None),
            ("/tokenize without a tokenizer",
             lambda: request(port, "POST", "/tokenize", {"prompt": "hello"}), 400,
             "no tokenizer", None),
            ("/detokenize outside the vocabulary",
             lambda: request(port, "POST", "/detokenize", {"tokens": [1, 99999]}), 400,
             "outside the vocabulary", "tokens"),
            ("a body over --max-request-bytes (sent whole)",
             lambda: request(port, "POST", "/v1/completions",
                             json.dumps(completion(prompt=[1] * 40000))), 413,
             "exceeds 65536 bytes", None),
            ("a Content-Length over --max-request-bytes",
             lambda: raw(port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                         b"Content-Length: 100000000\r\n\r\n{"), 413, "exceeds 65536 bytes", None),
            ("headers over 16 KiB",
             lambda: raw(port, f"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: {big_header}\r\n\r\n"
                         .encode()), 431, "exceed 16384 bytes", None),
            ("a malformed request line", lambda: raw(port, b"HELLO THERE\r\n\r\n"), 400,
             "malformed HTTP request", None),
            ("a bad Content-Length",
             lambda: raw(port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                         b"Content-Length: abc\r\n\r\n"), 400, "malformed HTTP request", None),
            ("a malformed chunked body",
             lambda: raw(port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                         b"Transfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n"), 400,
             "malformed HTTP request", None),
        ]
        for name, send, want_status, want_message, want_param in cases:
            checked += 1
            try:
                status, body, *_ = send()
            except Exception as e:  # noqa: BLE001
                failures.append(f"{name}: the request failed: {e!r}")
                continue
            error = body.get("error") if isinstance(body, dict) else None
            if status != want_status:
                failures.append(f"{name}: HTTP {status}, want {want_status}: {body!r:.300}")
            elif not isinstance(error, dict) or set(error) != {"message", "type", "param", "code"}:
                failures.append(f"{name}: not an OpenAI error object: {body!r:.300}")
            elif want_message not in error["message"]:
                failures.append(f"{name}: message {error['message']!r} lacks {want_message!r}")
            elif want_param is not None and error["param"] != want_param:
                failures.append(f"{name}: param {error['param']!r}, want {want_param!r}")
            if failures:
                print("FAIL:", failures[-1], flush=True)
            health, _, _ = request(port, "GET", "/health", token=None)
            if health != 200:
                failures.append(f"after '{name}': /health answered {health}")
                break
            if server.exit_description() is not None:
                failures.append(f"the server {server.exit_description()} after '{name}'")
                break

        # The error statuses through the same keep-alive connection: the connection stays usable.
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        for _ in range(3):
            conn.request("POST", "/v1/completions", body=json.dumps(completion(n=0)),
                         headers={"Authorization": f"Bearer {TOKEN}"})
            response = conn.getresponse()
            response.read()
            if response.status != 400:
                failures.append(f"keep-alive: HTTP {response.status}, want 400")
        conn.request("POST", "/v1/completions", body=json.dumps(completion()),
                     headers={"Authorization": f"Bearer {TOKEN}"})
        response = conn.getresponse()
        answer = json.loads(response.read())
        if response.status != 200 or answer["usage"]["completion_tokens"] != 2:
            failures.append(f"keep-alive: a good request after errors got {response.status} "
                            f"{answer!r:.300}")
        conn.close()

        # 429: a server of one sequence slot and a waiting queue that holds nothing, its slot
        # taken by a long stream (admission counts free slots first, so it needs one running).
        full = e2e_util.Server(args.build_dir, ["--model", model, "--http-port", "0",
                                                "--max-num-seqs", "1",
                                                "--max-queued-requests", "0"])
        checked += 1
        hold = http.client.HTTPConnection("127.0.0.1", full.http_port, timeout=60)
        hold.request("POST", "/v1/completions",
                     body=json.dumps(completion(model=None, n=16, max_tokens=500, ignore_eos=True,
                                                stream=True)).encode(),
                     headers={"Content-Type": "application/json"})
        held = hold.getresponse()
        held.readline()  # its first event: the request is in flight
        status, body, _ = request(full.http_port, "POST", "/v1/completions",
                                  completion(model=None))
        hold.close()
        if status != 429 or "waiting queue is full" not in body["error"]["message"]:
            failures.append(f"queue full: HTTP {status}, want 429: {body!r:.300}")
        full.stop()
        if full.process.returncode != 0:
            failures.append(f"the 429 server exited with {full.process.returncode} on SIGTERM")

        server.stop()
        if server.process.returncode != 0:
            failures.append(f"the server exited with {server.process.returncode} on SIGTERM, "
                            "not 0")
    except Exception:  # noqa: BLE001
        failures.append("the test itself failed (below)")
        print("FAILURES so far:\n  " + "\n  ".join(failures))
        print("server log:\n" + server.log()[-5000:])
        raise
    finally:
        log = server.log() if os.path.exists(server.log_file.name) else ""
        server.stop()
        if full is not None:
            full.stop()
        os.unlink(token_file)
    print(f"{checked} bad inputs checked")
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        print("server log:\n" + log[-5000:])
        return 1
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())

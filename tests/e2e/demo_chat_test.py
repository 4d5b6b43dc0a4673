#!/usr/bin/env python3
"""End to end with the demo model's own tokenizer and chat template (SmolLM2-135M-Instruct GGUF):
- Chat renders the conversation with the model's template: its greedy reply equals the greedy
  completion of `lmserve chat-template`'s text (whose equality with transformers'
  apply_chat_template is recorded in tests/reference/results), token for token;
- a text prompt streams (lmserve-cli complete) to the same text as the unary Complete;
- Tokenize and Detokenize round-trip the prompt.
Skips (exit 77) without the demo model ($LMSERVE_DEMO_MODEL or the fetch script's cache path).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import e2e_util  # noqa: E402


def demo_model():
    path = os.environ.get("LMSERVE_DEMO_MODEL")
    if not path:
        cache = os.environ.get("LMSERVE_CACHE_DIR") or os.path.join(
            os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "lmserve")
        path = os.path.join(cache, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
    return path if os.path.exists(path) else None


def json_lines(text):
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--build-dir", required=True)
    parser.add_argument("--fixtures-dir", required=True)
    args = parser.parse_args()
    model = demo_model()
    if model is None:
        print("SKIP: no demo model (scripts/fetch-demo-model.sh fetches it)")
        return 77
    failures = []
    server = e2e_util.Server(args.build_dir, ["--model", model, "--kv-cache-mb", "64"], timeout=240)
    try:
        question = "What is the capital of France? Answer in one sentence."
        code, out = server.cli("chat", question, "--max-tokens", "12", "--temperature", "0",
                               "--json", timeout=240)
        if code != 0:
            raise RuntimeError(f"chat failed ({code}): {out}\n{server.log()}")
        chat_ids = [i for m in json_lines(out) for i in m.get("token_ids", [])]
        chat_text = "".join(m.get("text", "") for m in json_lines(out))

        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump([{"role": "user", "content": question}], f)
            messages = f.name
        rendered = json.loads(subprocess.run(
            [os.path.join(args.build_dir, "bin", "lmserve"), "chat-template", "--model", model,
             "--messages", messages], capture_output=True, text=True, check=True).stdout)["text"]
        os.unlink(messages)
        code, out = server.cli("complete", rendered, "--max-tokens", "12", "--temperature", "0",
                               "--json", timeout=240)
        if code != 0:
            raise RuntimeError(f"complete failed ({code}): {out}")
        complete_ids = [i for m in json_lines(out) for i in m.get("token_ids", [])]
        complete_text = "".join(m.get("text", "") for m in json_lines(out))
        print(f"chat reply: {chat_text!r}")
        if not chat_ids or chat_ids != complete_ids or chat_text != complete_text:
            failures.append(f"Chat {chat_ids} {chat_text!r} != Complete of the rendered template "
                            f"{complete_ids} {complete_text!r}")
        if "Paris" not in chat_text:
            failures.append(f"the greedy reply does not name Paris: {chat_text!r}")

        code, out = server.cli("tokenize", question, "--json")
        ids = json.loads(out).get("token_ids") if code == 0 else None
        code, out = server.cli("detokenize", "--ids", ",".join(map(str, ids or [])), "--json")
        if code != 0 or json.loads(out).get("text") != question:
            failures.append(f"tokenize/detokenize did not round-trip: {ids} -> {out}")
    finally:
        server.stop()
    for failure in failures:
        print("FAIL:", failure)
    print(f"{3 - len(failures)} passed, {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

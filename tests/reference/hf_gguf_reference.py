#!/usr/bin/env python3
"""Outside check of lmserve against Hugging Face transformers reading the same GGUF file.

Runs where torch + transformers + gguf are installed (the GPU machine; transformers reads GGUF through
the `gguf` package and dequantizes it to float). For the demo model it compares:
  * teacher-forced logits: `lmserve logits` vs transformers in float64 on the dequantized weights
    (max abs error, relative L2, top-1 agreement per position);
  * tokenizer ids: `lmserve tokenize` vs AutoTokenizer(gguf_file=...) on the fixture strings and on
    a text file (one document per line);
  * chat templates: `lmserve chat-template` vs tokenizer.apply_chat_template for a few conversations.
Writes a JSON report and prints a summary. Usage:
  hf_gguf_reference.py --lmserve CMD --model FILE.gguf --fixtures DIR [--text FILE] --out REPORT.json
CMD is how to run bin/lmserve (e.g. ".gpu/bundle/run lmserve").
"""
import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile

import numpy as np
import torch
from safetensors.numpy import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer


def run(cmd):
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return out.stdout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lmserve", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--fixtures", required=True)
    ap.add_argument("--text")
    ap.add_argument("--out", required=True)
    ap.add_argument("--skip-logits", action="store_true")
    args = ap.parse_args()
    lm = shlex.split(args.lmserve)
    directory, filename = os.path.split(os.path.abspath(args.model))
    report = {}

    tok = AutoTokenizer.from_pretrained(directory, gguf_file=filename)

    # --- tokenizer ids ---
    cases = json.load(open(os.path.join(args.fixtures, "tokenizers", "tokenizer_cases.json")))
    strings = []
    for entry in cases.values() if isinstance(cases, dict) else cases:
        items = entry if isinstance(entry, list) else entry.get("cases", [])
        for case in items:
            if isinstance(case, dict) and "text" in case:
                strings.append(case["text"])
    strings = list(dict.fromkeys(strings))
    mismatches = []
    for s in strings:
        ours = json.loads(run(lm + ["tokenize", "--tokenizer", args.model, "--text", s]))["ids"]
        theirs = tok.encode(s, add_special_tokens=False)
        if ours != theirs:
            mismatches.append({"text": s, "ours": ours, "transformers": theirs})
    report["tokenizer_fixture_strings"] = {"count": len(strings), "mismatches": mismatches}
    if args.text:
        lines = open(args.text, encoding="utf-8").read().split("\n")
        with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False, encoding="utf-8") as f:
            f.write("\n".join(lines))
            path = f.name
        ours = json.loads(run(lm + ["tokenize", "--tokenizer", args.model, "--text-file", path,
                                    "--lines"]))["ids"]
        line_mismatch = []
        total_tokens = 0
        for i, line in enumerate(lines):
            theirs = tok.encode(line, add_special_tokens=False)
            total_tokens += len(theirs)
            if ours[i] != theirs:
                line_mismatch.append({"line": i, "text": line[:200], "ours": ours[i][:50],
                                      "transformers": theirs[:50]})
        report["tokenizer_text"] = {"bytes": sum(len(l.encode()) + 1 for l in lines),
                                    "lines": len(lines), "tokens": total_tokens,
                                    "mismatched_lines": len(line_mismatch),
                                    "examples": line_mismatch[:10]}

    # --- chat template ---
    conversations = [
        [{"role": "user", "content": "What is the capital of France?"}],
        [{"role": "system", "content": "You are a terse assistant."},
         {"role": "user", "content": "Hello!"}],
        [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How can I help?"},
         {"role": "user", "content": "Tell me a joke about cats."}],
        [{"role": "system", "content": "Answer in French."},
         {"role": "user", "content": "Ünïcödé «quotes» — and\nnewlines\n\n 😀"},
         {"role": "assistant", "content": "D'accord."}],
        [{"role": "user", "content": "  leading and trailing spaces  "},
         {"role": "assistant", "content": "ok"}, {"role": "user", "content": "{{ not a template }}"}],
    ]
    chat = []
    for conv in conversations:
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False, encoding="utf-8") as f:
            json.dump(conv, f)
            path = f.name
        ours = json.loads(run(lm + ["chat-template", "--model", args.model, "--messages", path]))["text"]
        theirs = tok.apply_chat_template(conv, tokenize=False, add_generation_prompt=True)
        chat.append({"equal": ours == theirs, "ours": ours, "transformers": theirs})
    report["chat_template"] = chat

    # --- logits ---
    if not args.skip_logits:
        model = AutoModelForCausalLM.from_pretrained(directory, gguf_file=filename,
                                                     dtype=torch.float32)
        model = model.double().eval()
        prompts = ["The capital of France is",
                   "def fibonacci(n):\n    if n < 2:\n        return n\n",
                   "<|im_start|>user\nWrite a haiku about the sea.<|im_end|>\n<|im_start|>assistant\n",
                   "Once upon a time, in a land far away, there lived a curious little robot who " * 3]
        results = []
        for p in prompts:
            ids = tok.encode(p, add_special_tokens=False)
            with torch.no_grad():
                ref = model(torch.tensor([ids])).logits[0].numpy()
            with tempfile.NamedTemporaryFile(suffix=".safetensors", delete=False) as f:
                path = f.name
            run(lm + ["logits", "--model", args.model, "--ids", ",".join(map(str, ids)), "--out", path])
            ours = load_file(path)["logits"].astype(np.float64)
            err = np.abs(ours - ref)
            rel_l2 = float(np.linalg.norm(ours - ref) / np.linalg.norm(ref))
            top1 = float(np.mean(np.argmax(ours, -1) == np.argmax(ref, -1)))
            results.append({"tokens": len(ids), "max_abs_err": float(err.max()), "rel_l2": rel_l2,
                            "top1_agreement": top1, "ref_abs_max": float(np.abs(ref).max())})
        report["logits"] = results

    json.dump(report, open(args.out, "w"), indent=1, ensure_ascii=False)
    print("tokenizer fixture strings:", report["tokenizer_fixture_strings"]["count"],
          "mismatches:", len(report["tokenizer_fixture_strings"]["mismatches"]))
    if "tokenizer_text" in report:
        t = report["tokenizer_text"]
        print("tokenizer text: %d bytes, %d lines, %d tokens, %d mismatched lines" %
              (t["bytes"], t["lines"], t["tokens"], t["mismatched_lines"]))
    print("chat template equal:", [c["equal"] for c in chat])
    for r in report.get("logits", []):
        print("logits: %(tokens)d tokens, max abs err %(max_abs_err).3e, rel L2 %(rel_l2).3e, "
              "top-1 %(top1_agreement).3f (|ref| max %(ref_abs_max).2f)" % r)


if __name__ == "__main__":
    sys.exit(main())

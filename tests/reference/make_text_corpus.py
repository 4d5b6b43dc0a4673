#!/usr/bin/env python3
"""Writes about 1 MB of varied UTF-8 text, one document line per line, for tokenizer comparisons:
source code and licence prose found on this machine, plus generated lines mixing numbers, CJK,
Cyrillic, accents, emoji and whitespace runs. Deterministic for a given machine.
Usage: make_text_corpus.py OUT [BYTES]"""
import glob
import os
import random
import sys
import sysconfig


def main():
    out, target = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 1 << 20
    rng = random.Random(1234)
    lines = []
    stdlib = sysconfig.get_paths()["stdlib"]
    for path in sorted(glob.glob(os.path.join(stdlib, "*.py")))[:80]:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines.extend(l.rstrip("\n") for l in f)
    for path in sorted(glob.glob("/usr/share/common-licenses/*"))[:8]:
        if os.path.isfile(path):
            with open(path, encoding="utf-8", errors="replace") as f:
                lines.extend(l.rstrip("\n") for l in f)
    pieces = ["Hello", "world", "  ", "\t", "1234567", "3.14159", "1,000,000", "你好世界", "日本語のテキスト",
              "Привет мир", "café naïve façade Grüße", "😀👍🏽", "🇫🇷", "ﬁ ligature", "'s", "'ll", "don't",
              "<|im_start|>", "<|im_end|>", "e\u0301", "x²", "αβγ", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "   trailing   "]
    for _ in range(4000):
        lines.append(" ".join(rng.choice(pieces) for _ in range(rng.randint(1, 12))))
    rng.shuffle(lines)
    text, size = [], 0
    for line in lines:
        b = len(line.encode("utf-8")) + 1
        if size + b > target:
            break
        text.append(line)
        size += b
    with open(out, "w", encoding="utf-8") as f:
        f.write("\n".join(text))


if __name__ == "__main__":
    main()

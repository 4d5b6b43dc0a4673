#!/usr/bin/env python3
"""Writes a synthetic byte-level BPE tokenizer.json with Llama 3's vocabulary size (128,000 regular
tokens + 256 special ones = 128,256), for lmserve-structured-bench's host mask time at that size.

The regular tokens are GPT-2's 256 byte characters, then deterministic (seeded) pieces shaped like a
real byte-level vocabulary's: words with and without a leading space ('Ġ'), capitalized words,
digit runs, punctuation and JSON fragments ('":', '",', '{"', ...), whitespace runs, and CJK and
accented characters as their UTF-8 bytes. The pieces are what a mask's trie walk sees (their bytes
and shared prefixes); the merges are a chain that keeps every piece reachable, not a trained model.

Usage: bench/make_bytelevel_vocab.py OUT.json [--size 128000] [--seed 1]
"""

import argparse
import json
import random


def bytes_to_unicode():
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars = printable[:]
    n = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(printable, chars)}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--size", type=int, default=128000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    b2u = bytes_to_unicode()

    def piece(text):
        return "".join(b2u[b] for b in text.encode("utf-8"))

    vocab = {}
    for b in range(256):
        vocab.setdefault(b2u[b], len(vocab))
    onsets = ["", "b", "c", "d", "f", "g", "h", "j", "k", "l", "m", "n", "p", "qu", "r", "s", "t",
              "v", "w", "x", "y", "z", "ch", "sh", "th", "st", "tr", "pr", "gr", "bl", "cl", "fl"]
    vowels = ["a", "e", "i", "o", "u", "y", "ai", "ea", "ou", "io", "ee", "oo"]
    codas = ["", "n", "r", "s", "t", "l", "m", "nd", "ng", "st", "rt", "ck", "x"]
    punctuation = ['":', '",', '{"', '"}', '},', '],', '":"', '":{"', '":[', '\\n', '\\"', '...',
                   '),', ');', '->', '=>', '==', '!=', '<=', '>=', '&&', '||', '::', '//', '/*']
    candidates = []
    while len(vocab) + len(candidates) < args.size * 2:
        kind = rng.random()
        if kind < 0.70:
            word = "".join(rng.choice(onsets) + rng.choice(vowels) + rng.choice(codas)
                           for _ in range(rng.choice([1, 1, 2, 2, 3])))
            if rng.random() < 0.3:
                word = word.capitalize()
            candidates.append((" " if rng.random() < 0.6 else "") + word)
        elif kind < 0.78:
            candidates.append((" " if rng.random() < 0.3 else "")
                              + "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 3))))
        elif kind < 0.85:
            candidates.append(rng.choice(punctuation) + rng.choice(["", " ", '"', "\n"]))
        elif kind < 0.88:
            candidates.append(rng.choice([" ", "\n", "\t"]) * rng.randint(2, 16))
        elif kind < 0.95:
            candidates.append("".join(chr(rng.randint(0x4E00, 0x9FFF))
                                      for _ in range(rng.randint(1, 2))))
        else:
            candidates.append((" " if rng.random() < 0.5 else "") +
                              "".join(rng.choice("àáâäçèéêëìíîïñòóôöùúûüß") + rng.choice(vowels)
                                      for _ in range(rng.randint(1, 2))))
    for text in candidates:
        if len(vocab) >= args.size:
            break
        vocab.setdefault(piece(text), len(vocab))
    merges = []
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "<|start_header_id|>",
                "<|end_header_id|>", "<|python_tag|>"]
    specials += [f"<|reserved_special_token_{k}|>" for k in range(256 - len(specials))]
    added = [{"id": args.size + k, "content": s, "single_word": False, "lstrip": False,
              "rstrip": False, "normalized": False, "special": True}
             for k, s in enumerate(specials)]
    tokenizer = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                          "use_regex": True},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "vocab": vocab, "merges": merges},
    }
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(tokenizer, f, ensure_ascii=False)
    with open(args.out[:-len(".json")] + "_config.json" if args.out.endswith("tokenizer.json")
              else args.out + ".config.json", "w", encoding="utf-8") as f:
        json.dump({"eos_token": "<|eot_id|>", "bos_token": "<|begin_of_text|>"}, f)
    print(f"{args.out}: {len(vocab)} regular + {len(added)} special tokens")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Writes a sample-lengths file (one integer a line, '#' comments) for memsim's training
config key `data.lengths` (docs/config.md, 'Sample lengths') from an alpaca-format JSON
dataset: a list of {"instruction", "input", "output"} objects.

With the real tokenizer at hand, the lengths are one line of Python instead:
    [len(tok.apply_chat_template(...)) for ...]  or  len(tok(text).input_ids)
This script is for machines without it: it counts a PROXY of Llama-3 tokens, the pieces of
Llama-3's pre-tokenizer split (the regex of tiktoken's cl100k / Meta's llama3 tokenizer.py
`pat_str`, with Python's `re` in place of `\\p{L}` / `\\p{N}`), which is a lower bound of the
BPE token count (each piece is at least one token; common English words are one), plus the
11 tokens of LLaMA-Factory's `llama3` template around one user and one assistant turn
(<|begin_of_text|>, two headers of 3 tokens and their "\\n\\n", two <|eot_id|>).

Usage: proxy_lengths.py DATASET.json SOURCE-TEXT > lengths.txt
"""
import json
import re
import sys

LETTER = r"[^\W\d_]"
DIGIT = r"\d"
# Llama 3 (tiktoken) pre-tokenizer, letters and numbers approximated with `re` classes.
PIECE = re.compile(
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)"
    rf"|[^\r\n\w]?{LETTER}+"
    rf"|{DIGIT}{{1,3}}"
    r"| ?[^\s\w]+[\r\n]*"
    r"|\s*[\r\n]+"
    r"|\s+(?!\S)"
    r"|\s+"
)
TEMPLATE_TOKENS = 11


def pieces(text):
    return len(PIECE.findall(text)) if text else 0


def main():
    path, source = sys.argv[1], sys.argv[2]
    with open(path, encoding="utf-8") as f:
        rows = json.load(f)
    print(f"# {source}")
    print(f"# {len(rows)} samples; length = Llama-3 pre-tokenizer pieces (a PROXY, a lower bound")
    print("# of the BPE tokens) of instruction + '\\n' + input and of output, + 11 template tokens")
    print("# (LLaMA-Factory llama3 template); written by tools/sample_lengths/proxy_lengths.py")
    for r in rows:
        prompt = r["instruction"] + ("\n" + r["input"] if r.get("input") else "")
        print(pieces(prompt) + pieces(r["output"]) + TEMPLATE_TOKENS)


if __name__ == "__main__":
    main()

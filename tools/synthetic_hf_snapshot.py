#!/usr/bin/env python3
"""Writes a SYNTHETIC torch.cuda.memory._snapshot() JSON for a Hugging Face Trainer run of
bert-large-uncased sequence classification (fp32, eager attention, AdamW, one device).

No GPU was lent to this work, so this file is not a recording: it lists, step by step, the
tensors transformers' modeling_bert.py and torch.optim.AdamW allocate and free (parameters at
load; per layer the saved activations of BertSelfAttention / BertSelfOutput / BertIntermediate /
BertOutput; the .grad of each parameter in the first backward; exp_avg / exp_avg_sq in the first
step), with sizes rounded as the CUDA caching allocator rounds them (512 B) and one segment per
request that does not fit the reserved memory (rounded to 2 MiB, never released). It exists to
exercise `memsim compare` on the snapshot format; its numbers are NOT a measurement, and the
file says so in its "_synthetic" key. Softmax saves its output only, as from PyTorch 1.11 (before,
it kept its input too; docs/validation.md, "Hugging Face Trainer"), so the ctest that compares
it runs the case at torch_version "1.12".

Usage: tools/synthetic_hf_snapshot.py OUT.json [--batch 4] [--seq 512] [--steps 3]
"""
import argparse
import json

H, FFN, LAYERS, HEADS, VOCAB, POS, TYPES, LABELS = 1024, 4096, 24, 16, 30522, 512, 2, 2
F32 = 4
MIB2 = 2 << 20


def params():
    """BertForSequenceClassification's parameters in construction order, element counts."""
    out = [("word_embeddings", VOCAB * H), ("position_embeddings", POS * H),
           ("token_type_embeddings", TYPES * H), ("embeddings.LayerNorm.weight", H),
           ("embeddings.LayerNorm.bias", H)]
    for l in range(LAYERS):
        for name, n in [("query.weight", H * H), ("query.bias", H), ("key.weight", H * H),
                        ("key.bias", H), ("value.weight", H * H), ("value.bias", H),
                        ("attention.output.dense.weight", H * H),
                        ("attention.output.dense.bias", H), ("attention.output.LayerNorm.weight", H),
                        ("attention.output.LayerNorm.bias", H), ("intermediate.dense.weight", FFN * H),
                        ("intermediate.dense.bias", FFN), ("output.dense.weight", H * FFN),
                        ("output.dense.bias", H), ("output.LayerNorm.weight", H),
                        ("output.LayerNorm.bias", H)]:
            out.append((f"layer{l}.{name}", n))
    out += [("pooler.dense.weight", H * H), ("pooler.dense.bias", H),
            ("classifier.weight", LABELS * H), ("classifier.bias", LABELS)]
    return out


class Trace:
    def __init__(self):
        self.events, self.t, self.addr = [], 1_700_000_000_000_000, 0x7F0000000000
        self.allocated, self.reserved, self.live = 0, 0, {}

    def _ev(self, action, size, addr):
        self.t += 10
        self.events.append({"action": action, "addr": addr, "size": size, "stream": 0,
                            "time_us": self.t, "frames": []})

    def alloc(self, name, nbytes):
        rounded = (nbytes + 511) // 512 * 512
        if self.allocated + rounded > self.reserved:
            seg = (rounded + MIB2 - 1) // MIB2 * MIB2
            self._ev("segment_alloc", seg, self.addr + self.reserved)
            self.reserved += seg
        self.addr += rounded
        self.live[name] = (self.addr, rounded)
        self.allocated += rounded
        self._ev("alloc", nbytes, self.addr)

    def free(self, name):
        addr, rounded = self.live.pop(name)
        self.allocated -= rounded
        self._ev("free_requested", rounded, addr)
        self._ev("free_completed", rounded, addr)


def layer_forward(tr, l, b, s, saved):
    act, s2 = F32 * b * s * H, F32 * b * HEADS * s * s
    # BertSelfAttention.forward: q, k, v projections (saved by the matmuls), scores and their
    # scaled and masked copies, softmax (saved), dropout (mask and output saved), context.
    for n in ("q", "k", "v"):
        tr.alloc(f"L{l}.{n}", act); saved.append(f"L{l}.{n}")
    tr.alloc(f"L{l}.scores", s2); tr.alloc(f"L{l}.scaled", s2); tr.free(f"L{l}.scores")
    tr.alloc(f"L{l}.masked", s2); tr.free(f"L{l}.scaled")
    tr.alloc(f"L{l}.probs", s2); tr.free(f"L{l}.masked")
    tr.alloc(f"L{l}.pmask", s2 // 4); tr.alloc(f"L{l}.pdrop", s2)
    tr.alloc(f"L{l}.ctx", act)
    saved += [f"L{l}.probs", f"L{l}.pmask", f"L{l}.pdrop", f"L{l}.ctx"]
    # BertSelfOutput, BertIntermediate (gelu saves its input), BertOutput: dense, dropout,
    # residual add, LayerNorm (input, mean, rstd saved; output is the next input).
    for part, width in (("att", H), ("out", H)):
        if part == "out":
            tr.alloc(f"L{l}.inter", F32 * b * s * FFN); tr.alloc(f"L{l}.gelu", F32 * b * s * FFN)
            saved += [f"L{l}.inter", f"L{l}.gelu"]
        tr.alloc(f"L{l}.{part}.dense", act); tr.alloc(f"L{l}.{part}.dmask", act // 4)
        tr.alloc(f"L{l}.{part}.drop", act); tr.free(f"L{l}.{part}.dense")
        tr.alloc(f"L{l}.{part}.sum", act); tr.free(f"L{l}.{part}.drop")
        tr.alloc(f"L{l}.{part}.stats", 8 * b * s); tr.alloc(f"L{l}.{part}.ln", act)
        saved += [f"L{l}.{part}.dmask", f"L{l}.{part}.sum", f"L{l}.{part}.stats", f"L{l}.{part}.ln"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--steps", type=int, default=3)
    a = ap.parse_args()
    b, s = a.batch, a.seq
    tr = Trace()
    ps = params()
    for name, n in ps:
        tr.alloc(name, F32 * n)
    grads = False
    for step in range(a.steps):
        saved = []
        for n in ("input_ids", "token_type_ids", "attention_mask"):
            tr.alloc(f"{n}{step}", 8 * b * s)
        tr.alloc("emb.sum", F32 * b * s * H); tr.alloc("emb.stats", 8 * b * s)
        tr.alloc("emb.mask", b * s * H); tr.alloc("emb.out", F32 * b * s * H)
        for l in range(LAYERS):
            layer_forward(tr, l, b, s, saved)
        for l in reversed(range(LAYERS)):  # backward: a transient grad, then the saved freed
            tr.alloc(f"dL{l}", F32 * b * s * H)
            if not grads:
                for name, n in ps:
                    if name.startswith(f"layer{l}."):
                        tr.alloc("grad." + name, F32 * n)
            for t in [x for x in saved if x.startswith(f"L{l}.")]:
                tr.free(t)
            tr.free(f"dL{l}")
        if not grads:
            for name, n in ps:
                if not name.startswith("layer"):
                    tr.alloc("grad." + name, F32 * n)
            grads = True
        for t in ("emb.sum", "emb.stats", "emb.mask", "emb.out"):
            tr.free(t)
        for n in ("input_ids", "token_type_ids", "attention_mask"):
            tr.free(f"{n}{step}")
        if step == 0:  # AdamW._init_group: exp_avg, exp_avg_sq per parameter
            for name, n in ps:
                tr.alloc("exp_avg." + name, F32 * n)
                tr.alloc("exp_avg_sq." + name, F32 * n)
    segment = {"device": 0, "address": 0x7F0000000000, "total_size": tr.reserved,
               "allocated_size": tr.allocated, "active_size": tr.allocated,
               "requested_size": tr.allocated, "stream": 0, "segment_type": "large",
               "segment_pool_id": [0, 0], "is_expandable": False, "frames": [],
               "blocks": [{"address": 0x7F0000000000, "size": tr.allocated,
                           "requested_size": tr.allocated, "state": "active_allocated",
                           "frames": []}]
                          + ([{"address": 0x7F0000000000 + tr.allocated,
                               "size": tr.reserved - tr.allocated, "requested_size": 0,
                               "state": "inactive", "frames": []}]
                             if tr.reserved > tr.allocated else [])}
    doc = {"_synthetic": "SYNTHETIC, not a recording: made by tools/synthetic_hf_snapshot.py "
                         f"(bert-large-uncased classification, batch {b}, seq {s}, fp32, "
                         f"{a.steps} steps) from transformers' modeling_bert.py tensor list",
           "segments": [segment], "device_traces": [tr.events]}
    with open(a.out, "w") as f:
        json.dump(doc, f, separators=(",", ":"))


if __name__ == "__main__":
    main()

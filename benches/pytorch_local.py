#!/usr/bin/env python3
"""The configuration of `benches/local.rs`, in PyTorch on the CPU, for a side-by-side ratio.

    ~/.cache/rlvr-peer/venv/bin/python benches/pytorch_local.py [--threads 2]

Needs torch and transformers (Qwen3). Same model (Qwen3 architecture, vocabulary 512,
hidden 128, MLP 384, 4 layers, 4 heads / 2 KV heads, head dim 32, tied embeddings, f32),
same work per iteration:

- train/full, train/lora8: forward + backward of the summed cross-entropy over 16 x 256
  tokens, then an AdamW step (full parameters, or rank-8 LoRA on the attention and MLP
  projections and the unembedding with the base frozen);
- sample/n1, sample/n8: a 32-token prompt, 64 new tokens per sequence at temperature 1 with a
  KV cache, 1 or 8 sequences in one batch.

Prints tokens/s (median of the timed iterations) per benchmark.
"""

import argparse
import math
import statistics
import time

import torch
import torch.nn as nn
from transformers import Qwen3Config, Qwen3ForCausalLM

VOCAB, BATCH, SEQ, PROMPT, NEW = 512, 16, 256, 32, 64


def model():
    torch.manual_seed(0)
    cfg = Qwen3Config(
        vocab_size=VOCAB, hidden_size=128, intermediate_size=384, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        max_position_embeddings=1024, tie_word_embeddings=True, rope_theta=10000.0,
        attn_implementation="eager",
    )
    return Qwen3ForCausalLM(cfg).float()


class LoRA(nn.Module):
    def __init__(self, base, r):
        super().__init__()
        self.base = base
        self.a = nn.Parameter(torch.randn(r, base.in_features) / math.sqrt(base.in_features))
        self.b = nn.Parameter(torch.zeros(base.out_features, r))

    def forward(self, x):
        return self.base(x) + (x @ self.a.t()) @ self.b.t()


def add_lora(m, r):
    for p in m.parameters():
        p.requires_grad_(False)
    for layer in m.model.layers:
        for n in ["q_proj", "k_proj", "v_proj", "o_proj"]:
            setattr(layer.self_attn, n, LoRA(getattr(layer.self_attn, n), r))
        for n in ["gate_proj", "up_proj", "down_proj"]:
            setattr(layer.mlp, n, LoRA(getattr(layer.mlp, n), r))
    # The unembedding is tied to the embedding: adapt it as an extra low-rank head.
    head = m.lm_head
    m.lm_head = LoRA(head, r)
    return m


def timed(fn, warmup, iters):
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(iters):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def bench_train(lora, iters):
    m = model()
    if lora:
        m = add_lora(m, 8)
    params = [p for p in m.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4, betas=(0.9, 0.95), eps=1e-12, weight_decay=0.0)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=g)

    def step():
        logits = m(ids[:, :-1]).logits
        lp = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None])
        loss = -lp.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return BATCH * SEQ / timed(step, 2, iters)


@torch.no_grad()
def bench_sample(n, iters):
    m = model().eval()
    g = torch.Generator().manual_seed(99)
    prompt = torch.randint(0, VOCAB, (1, PROMPT), generator=g)

    def run():
        ids = prompt.expand(n, PROMPT).contiguous()
        out = m(ids, use_cache=True)
        past, logits = out.past_key_values, out.logits[:, -1]
        for _ in range(NEW):
            nxt = torch.multinomial(torch.softmax(logits, -1), 1)
            out = m(nxt, past_key_values=past, use_cache=True)
            past, logits = out.past_key_values, out.logits[:, -1]

    return n * NEW / timed(run, 1, iters)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--iters", type=int, default=10)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    print(f"torch {torch.__version__}, {a.threads} threads")
    print(f"train/full   {bench_train(False, a.iters):10.0f} tokens/s")
    print(f"train/lora8  {bench_train(True, a.iters):10.0f} tokens/s")
    print(f"sample/n1    {bench_sample(1, a.iters):10.0f} tokens/s")
    print(f"sample/n8    {bench_sample(8, a.iters):10.0f} tokens/s")


if __name__ == "__main__":
    main()

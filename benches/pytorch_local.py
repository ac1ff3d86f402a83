#!/usr/bin/env python3
"""The configurations of `benches/local.rs`, in PyTorch (on the CPU, or `--device cuda`), for a side-by-side ratio.

    ~/.cache/rlvr-peer/venv/bin/python benches/pytorch_local.py [--threads 2] \
        [--config bench|realistic] [--iters 5] [--only PREFIX] [--device cpu|cuda]

Needs torch and transformers (Qwen3). Same models (Qwen3 architecture, tied embeddings, f32):
`bench` (vocabulary 512, hidden 128, MLP 384, 4 layers, 4 heads / 2 KV heads, head dim 32,
training batches of 16 x 256 tokens, 64 new tokens per sample) and `realistic` (vocabulary
32,768, hidden 1024, MLP 3072, 2 layers, 16 heads / 8 KV heads, head dim 64, 4 x 512
tokens, 128 new tokens per sample); same work per iteration:

- gemm/peak: one 2048 x 2048 x 2048 f32 `torch.mm`, in FLOP/s;
- train/full, train/lora8: forward + backward of the summed cross-entropy, then an AdamW
  step (full parameters, or rank-8 LoRA on the attention and MLP projections and the
  unembedding with the base frozen);
- sample/nB: a 32-token prompt, new tokens per sequence at temperature 1 with a KV cache,
  B sequences in one batch (1, 8, 64 for `bench`; 64 for `realistic`).

Prints tokens/s (median of the timed iterations, after one warm-up) per benchmark, in the
format of `cargo bench --bench local -- --compare`.
"""

import argparse
import math
import statistics
import time
import warnings

import torch
import torch.nn as nn
from transformers import Qwen3Config, Qwen3ForCausalLM
from transformers.utils import logging as hf_logging

warnings.filterwarnings("ignore")
hf_logging.set_verbosity_error()

CONFIGS = {
    "bench": dict(vocab=512, hidden=128, mlp=384, layers=4, heads=4, kv=2, hd=32,
                  batch=16, seq=256, new=64, samples=[1, 8, 64]),
    "realistic": dict(vocab=32768, hidden=1024, mlp=3072, layers=2, heads=16, kv=8, hd=64,
                      batch=4, seq=512, new=128, samples=[64]),
}
C = CONFIGS["bench"]
PROMPT = 32
DEV = torch.device("cpu")


def model():
    torch.manual_seed(0)
    cfg = Qwen3Config(
        vocab_size=C["vocab"], hidden_size=C["hidden"], intermediate_size=C["mlp"],
        num_hidden_layers=C["layers"], num_attention_heads=C["heads"],
        num_key_value_heads=C["kv"], head_dim=C["hd"],
        max_position_embeddings=1024, tie_word_embeddings=True, rope_theta=10000.0,
        attn_implementation="eager",
    )
    return Qwen3ForCausalLM(cfg).float().to(DEV)


class LoRA(nn.Module):
    def __init__(self, base, r):
        super().__init__()
        self.base = base
        dev = base.weight.device
        self.a = nn.Parameter(torch.randn(r, base.in_features, device=dev) / math.sqrt(base.in_features))
        self.b = nn.Parameter(torch.zeros(base.out_features, r, device=dev))

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


def gemm_peak(n, iters):
    a, b = torch.rand(n, n, device=DEV), torch.rand(n, n, device=DEV)
    return 2 * n**3 / timed(lambda: torch.mm(a, b), 1, iters)


def sync():
    if DEV.type == "cuda":
        torch.cuda.synchronize()


def timed(fn, warmup, iters):
    for _ in range(warmup):
        fn()
    sync()
    ts = []
    for _ in range(iters):
        t = time.perf_counter()
        fn()
        sync()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def bench_train(lora, iters):
    m = model()
    if lora:
        m = add_lora(m, 8)
    params = [p for p in m.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4, betas=(0.9, 0.95), eps=1e-12, weight_decay=0.0)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, C["vocab"], (C["batch"], C["seq"] + 1), generator=g).to(DEV)

    def step():
        logits = m(ids[:, :-1]).logits
        lp = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None])
        loss = -lp.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return C["batch"] * C["seq"] / timed(step, 1, iters)


@torch.no_grad()
def bench_sample(n, iters):
    m = model().eval()
    g = torch.Generator().manual_seed(99)
    prompt = torch.randint(0, C["vocab"], (1, PROMPT), generator=g).to(DEV)

    def run():
        ids = prompt.expand(n, PROMPT).contiguous()
        out = m(ids, use_cache=True)
        past, logits = out.past_key_values, out.logits[:, -1]
        for _ in range(C["new"]):
            nxt = torch.multinomial(torch.softmax(logits, -1), 1)
            out = m(nxt, past_key_values=past, use_cache=True)
            past, logits = out.past_key_values, out.logits[:, -1]

    return n * C["new"] / timed(run, 1, iters)


def main():
    global C, DEV
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--config", choices=sorted(CONFIGS), default="bench")
    ap.add_argument("--only", default="", help="run only the benchmarks starting with this")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    a = ap.parse_args()
    C = CONFIGS[a.config]
    DEV = torch.device(a.device)
    torch.set_num_threads(a.threads)
    print(f"torch {torch.__version__}, config {a.config}, threads {a.threads}, device {a.device}")
    if ("gemm".startswith(a.only) or a.only.startswith("gemm")) and a.device == "cpu":
        print(f"gemm/peak {gemm_peak(2048, min(a.iters, 5)):.3e} flop/s")
    for name, lora in [("train/full", False), ("train/lora8", True)]:
        if name.startswith(a.only):
            print(f"{name} {bench_train(lora, a.iters):.1f} tokens/s", flush=True)
    for n in C["samples"]:
        name = f"sample/n{n}"
        if name.startswith(a.only):
            print(f"{name} {bench_sample(n, a.iters):.1f} tokens/s", flush=True)


if __name__ == "__main__":
    main()

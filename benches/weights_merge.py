#!/usr/bin/env python3
"""The merge benchmark's Python side (benches/weights_merge.sh).

    weights_merge.py make DIR     # DIR/base (Qwen3-0.6B's shapes, random bf16, 2 shards),
                                  # DIR/adapter (Tinker format, rank 32, every linear layer
                                  # and the output head)
    weights_merge.py cookbook DIR OUT   # tinker-cookbook 0.6.1's weights.build_hf_model
    weights_merge.py compare A B        # every tensor of two merged directories equal?
"""
import json
import os
import sys
import time
import types

import torch
from safetensors import safe_open
from safetensors.torch import save_file

# Qwen3-0.6B's shapes.
HIDDEN, INTER, LAYERS, HEADS, KV, HEAD_DIM, VOCAB = 1024, 3072, 28, 16, 8, 128, 151936
RANK, ALPHA = 32, 32


def make(root):
    base = os.path.join(root, "base")
    adapter = os.path.join(root, "adapter")
    os.makedirs(base)
    os.makedirs(adapter)
    g = torch.Generator().manual_seed(0)

    def w(*shape):
        return (torch.randn(*shape, generator=g) * 0.02).to(torch.bfloat16)

    mods = {
        "self_attn.q_proj": (HEADS * HEAD_DIM, HIDDEN),
        "self_attn.k_proj": (KV * HEAD_DIM, HIDDEN),
        "self_attn.v_proj": (KV * HEAD_DIM, HIDDEN),
        "self_attn.o_proj": (HIDDEN, HEADS * HEAD_DIM),
        "mlp.gate_proj": (INTER, HIDDEN),
        "mlp.up_proj": (INTER, HIDDEN),
        "mlp.down_proj": (HIDDEN, INTER),
    }
    shards = [{}, {}]
    shards[0]["model.embed_tokens.weight"] = w(VOCAB, HIDDEN)
    shards[1]["lm_head.weight"] = w(VOCAB, HIDDEN)
    shards[1]["model.norm.weight"] = w(HIDDEN)
    lora = {}
    for l in range(LAYERS):
        s = shards[0] if l < LAYERS // 2 else shards[1]
        for m, (o, i) in mods.items():
            s[f"model.layers.{l}.{m}.weight"] = w(o, i)
            lora[f"base_model.model.model.layers.{l}.{m}.lora_A.weight"] = torch.randn(RANK, i, generator=g) * 0.01
            lora[f"base_model.model.model.layers.{l}.{m}.lora_B.weight"] = torch.randn(o, RANK, generator=g) * 0.01
        for n in ["input_layernorm", "post_attention_layernorm"]:
            s[f"model.layers.{l}.{n}.weight"] = w(HIDDEN)
        s[f"model.layers.{l}.self_attn.q_norm.weight"] = w(HEAD_DIM)
        s[f"model.layers.{l}.self_attn.k_norm.weight"] = w(HEAD_DIM)
    lora["base_model.model.model.unembed_tokens.lora_A.weight"] = torch.randn(RANK, HIDDEN, generator=g) * 0.01
    lora["base_model.model.model.unembed_tokens.lora_B.weight"] = torch.randn(VOCAB, RANK, generator=g) * 0.01
    weight_map, total = {}, 0
    for i, s in enumerate(shards):
        name = f"model-{i + 1:05d}-of-00002.safetensors"
        save_file(s, os.path.join(base, name), metadata={"format": "pt"})
        for k, t in s.items():
            weight_map[k] = name
            total += t.numel() * t.element_size()
    json.dump({"metadata": {"total_size": total}, "weight_map": weight_map},
              open(os.path.join(base, "model.safetensors.index.json"), "w"), indent=2)
    json.dump({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
               "hidden_size": HIDDEN, "intermediate_size": INTER, "num_hidden_layers": LAYERS,
               "num_attention_heads": HEADS, "num_key_value_heads": KV, "head_dim": HEAD_DIM,
               "vocab_size": VOCAB, "tie_word_embeddings": False, "torch_dtype": "bfloat16"},
              open(os.path.join(base, "config.json"), "w"), indent=2)
    save_file(lora, os.path.join(adapter, "adapter_model.safetensors"))
    json.dump({"lora_alpha": ALPHA, "r": RANK}, open(os.path.join(adapter, "adapter_config.json"), "w"))


def cookbook(root, out):
    sys.modules.setdefault("pyrage", types.ModuleType("pyrage"))
    from tinker_cookbook import weights

    torch.set_num_threads(os.cpu_count())
    t = time.perf_counter()
    weights.build_hf_model(base_model=os.path.join(root, "base"),
                           adapter_path=os.path.join(root, "adapter"), output_path=out)
    print(f"cookbook build_hf_model: {time.perf_counter() - t:.2f} s", file=sys.stderr)


def compare(a, b):
    names = sorted(f for f in os.listdir(a) if f.endswith(".safetensors"))
    assert names == sorted(f for f in os.listdir(b) if f.endswith(".safetensors")), "shard names"
    n = 0
    for name in names:
        with safe_open(os.path.join(a, name), "pt") as fa, safe_open(os.path.join(b, name), "pt") as fb:
            assert sorted(fa.keys()) == sorted(fb.keys()), name
            for k in fa.keys():
                ta, tb = fa.get_tensor(k), fb.get_tensor(k)
                assert ta.dtype == tb.dtype and ta.shape == tb.shape, k
                assert torch.equal(ta, tb), f"{k} differs"
                n += 1
    print(f"equal: {n} tensors in {len(names)} shards")


if __name__ == "__main__":
    {"make": make, "cookbook": cookbook, "compare": compare}[sys.argv[1]](*sys.argv[2:])

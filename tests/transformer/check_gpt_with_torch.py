#!/usr/bin/python3
"""Rebuilds remat's GPT<23, 12, 16, 4, 2> in PyTorch from the safetensors file alone (read with the
standard library, following the specification), runs the same batch forward and backward, and
compares logits, loss and every parameter gradient with what remat wrote. The architecture is
written out here by hand (GPT-2's pre-norm block, nanoGPT's layout of the QKV projection):
  x = wte[ids] + wpe[positions]
  per block: x = x + proj(attn(qkv(LN1(x))));  x = x + fc2(gelu(fc1(LN2(x))))
  logits = head(LN(x))
"""
import math
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from safetensors_reader import read_safetensors  # noqa: E402


def causal_attention(qkv, heads):
    b, t, three_w = qkv.shape
    w = three_w // 3
    q, k, v = qkv.split(w, dim=2)
    shape = (b, t, heads, w // heads)
    q, k, v = (z.reshape(shape).transpose(1, 2) for z in (q, k, v))  # b, heads, t, d
    scores = q @ k.transpose(-2, -1) / math.sqrt(w // heads)
    mask = torch.ones(t, t, dtype=torch.bool).tril()
    scores = scores.masked_fill(~mask, float("-inf"))
    y = torch.softmax(scores, dim=-1) @ v
    return y.transpose(1, 2).reshape(b, t, w)


def main(directory):
    torch.set_num_threads(2)
    F = torch.nn.functional
    params = {k: v.clone().requires_grad_(True) for k, v in read_safetensors(f"{directory}/gpt_weights.safetensors").items()}
    io = read_safetensors(f"{directory}/gpt_io.safetensors")
    ids, targets = io["ids"].long(), io["targets"].long()
    vocab, width, heads, blocks = 23, 16, 4, 2
    b, t = ids.shape

    def ln(x, prefix):
        return F.layer_norm(x, (width,), params[prefix + "weight"], params[prefix + "bias"], eps=1e-5)

    def linear(x, prefix):
        return F.linear(x, params[prefix + "weight"], params[prefix + "bias"])

    x = params["0.weight"][ids] + params["1.weight"][:t]
    for k in range(blocks):
        p = f"3.{k}."
        x = x + linear(causal_attention(linear(ln(x, p + "0.0."), p + "0.1."), heads), p + "0.3.")
        x = x + linear(F.gelu(linear(ln(x, p + "1.0."), p + "1.1.")), p + "1.3.")
    logits = linear(ln(x, "4."), "5.")
    loss = F.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1))
    loss.backward()

    failures = []
    def compare(what, ours, theirs, tol):
        err = (ours - theirs).abs().max().item()
        scale = max(1.0, theirs.abs().max().item())
        ok = err <= tol * scale
        if not ok:
            failures.append(f"{what}: max |torch - remat| = {err:.3g} (scale {scale:.3g})")
        return err

    e_logits = compare("logits", io["logits"], logits.detach().reshape(-1, vocab), 1e-5)
    e_loss = compare("loss", io["loss"], loss.detach().reshape(1), 1e-6)
    e_grad = 0.0
    for name, value in params.items():
        e_grad = max(e_grad, compare("grad " + name, io["grad." + name], value.grad, 1e-5))
    print(f"torch {torch.__version__}: loss {loss.item():.6f}; max |torch - remat|: logits {e_logits:.3g}, "
          f"loss {e_loss:.3g}, gradients of {len(params)} tensors {e_grad:.3g}")
    for f in failures:
        print("FAILED:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "."))

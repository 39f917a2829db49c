#!/usr/bin/python3
"""Reads remat's safetensors files with nothing but the standard library (following the
safetensors specification) and PyTorch, recomputes the model's forward pass with torch, and
compares it with the output remat wrote. The architecture is written out here by hand:
  Seq<Linear<6,16>, GELU, Residual<Seq<LayerNorm<16>, Linear<16,16>, Tanh>>, RMSNorm<16>, Linear<16,3>>
"""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from safetensors_reader import read_safetensors  # noqa: E402


def main(directory):
    torch.set_num_threads(2)
    w = read_safetensors(f"{directory}/fixture_weights.safetensors")
    io = read_safetensors(f"{directory}/fixture_io.safetensors")
    x = io["x"]
    F = torch.nn.functional
    h = F.gelu(F.linear(x, w["0.weight"], w["0.bias"]))
    r = F.layer_norm(h, (16,), w["2.0.weight"], w["2.0.bias"], eps=1e-5)
    h = h + torch.tanh(F.linear(r, w["2.1.weight"], w["2.1.bias"]))
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-5) * w["3.weight"]
    y = F.linear(h, w["4.weight"], w["4.bias"])
    err = (y - io["y"]).abs().max().item()
    print(f"torch {torch.__version__}: max |torch - remat| = {err:.3g} over {y.numel()} outputs")
    if not err <= 1e-5:
        print("FAILED: remat's output differs from PyTorch's on the same weights")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "."))

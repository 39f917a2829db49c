"""The surrogates of bench_inference in PyTorch, for bench/compare_inference.py (torch.compile on
the CPU) and bench/inference_torch_cuda.py (the GPU): the per-cell MLP 5 -> 256 -> 256 -> 256 -> 5
with GELU, and examples/surrogate's convolutional network on its 64 x 64 grid (three residual
blocks of two 3 x 3 convolutions of 16 channels, BatchNorm and GELU between them)."""
import torch


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Conv2d(16, 16, 3, padding=1, bias=False)
        self.bn = torch.nn.BatchNorm2d(16)
        self.b = torch.nn.Conv2d(16, 16, 3, padding=1)

    def forward(self, x):
        return x + self.b(torch.nn.functional.gelu(self.bn(self.a(x))))


def surrogate(name, device="cpu", rows=None):
    """(the network in eval mode, its inputs for the largest batch, `rows` or the default 256 (conv)
    and 4096 (mlp): sin(0.01 i) as bench_inference's)"""
    if name == "conv":
        net = torch.nn.Sequential(torch.nn.Conv2d(2, 16, 3, padding=1), torch.nn.GELU(), Block(), Block(), Block(),
                                  torch.nn.Conv2d(16, 2, 3, padding=1))
        shape = (rows or 256, 2, 64, 64)
    else:
        net = torch.nn.Sequential(torch.nn.Linear(5, 256), torch.nn.GELU(), torch.nn.Linear(256, 256),
                                  torch.nn.GELU(), torch.nn.Linear(256, 256), torch.nn.GELU(),
                                  torch.nn.Linear(256, 5))
        shape = (rows or 4096, 5)
    numel = 1
    for s in shape:
        numel *= s
    x = torch.sin(0.01 * torch.arange(numel, dtype=torch.float32, device=device)).reshape(*shape)
    return net.to(device).eval(), x

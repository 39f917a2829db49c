#!/usr/bin/python3
"""Rebuilds remat's small convolutional model in PyTorch from the safetensors file alone (read with
the standard library), and compares with what remat wrote: the inference output (BatchNorm by its
running statistics), the training loss (batch statistics), every parameter gradient, and the
running statistics after that one training pass (PyTorch's momentum update). The architecture:
  Conv2d(2, 4, 3, padding 1), BatchNorm2d(4), ReLU, MaxPool2d(2),
  Conv2d(4, 6, 3, stride 2, padding 1, no bias), GroupNorm(2, 6), GELU, Upsample(x2, nearest),
  AvgPool2d(2, stride 1), flatten, Linear(54, 5); MSE loss.
"""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from safetensors_reader import read_safetensors  # noqa: E402


def main(directory):
    torch.set_num_threads(2)
    F = torch.nn.functional
    weights = read_safetensors(f"{directory}/conv_weights.safetensors")
    io = read_safetensors(f"{directory}/conv_io.safetensors")
    buffers = {k: v.clone() for k, v in weights.items() if "running" in k}
    params = {k: v.clone().requires_grad_(True) for k, v in weights.items() if "running" not in k}
    expected = {"0.weight", "0.bias", "1.weight", "1.bias", "4.weight", "5.weight", "5.bias", "9.weight", "9.bias"}
    assert set(params) == expected, sorted(params)
    assert set(buffers) == {"1.running_mean", "1.running_var"}, sorted(buffers)
    x, t = io["x"], io["t"]

    def net(x, training, rm, rv):
        y = F.conv2d(x, params["0.weight"], params["0.bias"], padding=1)
        y = F.batch_norm(y, rm, rv, params["1.weight"], params["1.bias"], training=training, momentum=0.1, eps=1e-5)
        y = F.max_pool2d(torch.relu(y), 2)
        y = F.conv2d(y, params["4.weight"], None, stride=2, padding=1)
        y = F.gelu(F.group_norm(y, 2, params["5.weight"], params["5.bias"], eps=1e-5))
        y = F.avg_pool2d(F.interpolate(y, scale_factor=2, mode="nearest"), 2, stride=1)
        return F.linear(y.flatten(1), params["9.weight"], params["9.bias"])

    with torch.no_grad():
        inference = net(x, False, buffers["1.running_mean"].clone(), buffers["1.running_var"].clone())
    rm, rv = buffers["1.running_mean"].clone(), buffers["1.running_var"].clone()
    loss = F.mse_loss(net(x, True, rm, rv), t)
    loss.backward()

    failures = []

    def compare(what, ours, theirs, tol):
        err = (ours - theirs).abs().max().item()
        scale = max(1.0, theirs.abs().max().item())
        if err > tol * scale:
            failures.append(f"{what}: max |torch - remat| = {err:.3g} (scale {scale:.3g})")
        return err

    e_inf = compare("inference", io["inference"], inference, 1e-5)
    e_loss = compare("loss", io["loss"], loss.detach().reshape(1), 1e-6)
    e_grad = 0.0
    for name, value in params.items():
        e_grad = max(e_grad, compare("grad " + name, io["grad." + name], value.grad, 1e-5))
    e_run = max(compare("running mean", io["after.1.running_mean"], rm, 1e-6),
                compare("running var", io["after.1.running_var"], rv, 1e-6))
    # The running statistics moved, so the comparison means something.
    if (rm - buffers["1.running_mean"]).abs().max().item() < 1e-4:
        failures.append("the running mean did not move in PyTorch's training pass")
    print(f"torch {torch.__version__}: loss {loss.item():.6f}; max |torch - remat|: inference {e_inf:.3g}, "
          f"loss {e_loss:.3g}, gradients of {len(params)} tensors {e_grad:.3g}, running statistics {e_run:.3g}")
    for f in failures:
        print("FAILED:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "."))

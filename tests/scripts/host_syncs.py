"""A training loop that reads values back (capture/hostsync.py): every way the host waits for the GPU.

Per iteration: forward (mm, sum), backward, clip_grad_norm_(error_if_nonfinite=True) (a bool read
of the norm), optimizer step, then loss.item() logged, a .cpu() copy, torch.cuda.synchronize().
The asserts check the placeholders the script reads.
"""
import torch

torch.manual_seed(0)
w = torch.nn.Parameter(torch.randn(64, 64, device="cuda"))
opt = torch.optim.SGD([w], lr=0.1)
x = torch.randn(64, 64, device="cuda")
for step in range(3):
    loss = (x @ w).sum()
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_([w], 1.0, error_if_nonfinite=True)
    opt.step()
    opt.zero_grad()
    value = loss.item()
    assert value == 0.0 and isinstance(value, float)
    assert torch.isfinite(norm).all().item() is True and bool(torch.isnan(norm).any()) is False
    host = w.detach().cpu()
    torch.cuda.synchronize()
    print(f"step {step} loss {value:.3f}")

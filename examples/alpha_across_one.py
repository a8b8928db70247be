"""Learn alpha-entmax's alpha per head by gradient descent, across alpha = 1.

Two "heads" look at the same scores; each head's target weights were made by entmax at an alpha unknown to the
learner: 0.6 (dense, heavier tails than softmax) and 1.7 (sparse).  Both start at alpha = 1.2 and follow the
gradient of a squared error in the weights.  The first head's alpha crosses 1 on its way down: the map
(numeric's family ``entmax``: entmax_sparse above 1, softmax at 1, entmax_dense below) and its gradient in alpha
are continuous there, so plain gradient descent passes through.

Run: python examples/alpha_across_one.py   (needs torch)
"""

from __future__ import annotations

import torch

from numeric import torch as rt

torch.manual_seed(0)
scores = torch.randn(2, 16, dtype=torch.float64) * 2
target_alpha = torch.tensor([[0.6], [1.7]], dtype=torch.float64)
target = rt.entmax(scores, target_alpha)

alpha = torch.full((2, 1), 1.2, dtype=torch.float64, requires_grad=True)
optimizer = torch.optim.Adam([alpha], lr=0.05)
crossed = None
for step in range(301):
    optimizer.zero_grad()
    loss = ((rt.entmax(scores, alpha) - target) ** 2).sum()
    loss.backward()
    optimizer.step()
    with torch.no_grad():
        alpha.clamp_(min=0.05)  # alpha > 0: the family's domain
    if crossed is None and alpha[0, 0] < 1:
        crossed = step
    if step % 50 == 0:
        print(f"step {step:3d}  loss {loss.item():.3e}  alpha = {alpha[0, 0].item():.4f}, {alpha[1, 0].item():.4f}")

print(f"head 0 crossed alpha = 1 at step {crossed}; learned alphas {alpha.detach().flatten().tolist()}")
print(f"targets {target_alpha.flatten().tolist()}")
assert crossed is not None and abs(alpha[0, 0].item() - 0.6) < 0.02 and abs(alpha[1, 0].item() - 1.7) < 0.02

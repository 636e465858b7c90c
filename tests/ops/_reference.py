"""Deliberately simple float64 Sol-Attn, written from sol_attn.md for the tests: one query row at a time,
no code shared with accelpatch. Also the independent count of always-exact (neighbour + sink) pairs."""
import math

import torch

BLOCK = 64


def always_exact_blocks(t, sink_tokens, sink_start):
    """Per query block, the set of key blocks that are exact whatever tau is (neighbours and sink)."""
    n = math.ceil(t / BLOCK)
    sink = set()
    if sink_tokens > 0:
        s = t - sink_tokens if sink_start is None else sink_start
        first, last = math.floor(s / BLOCK), math.ceil((s + sink_tokens) / BLOCK) - 1
        sink = {j for j in range(n) if first <= j <= last}
    return [{j for j in range(n) if abs(i - j) <= 1} | sink for i in range(n)]


def reference_sol_attn(q, k, v, *, scale=None, tau=1.0, thresh_type="diag", sink_tokens=0, sink_start=None):
    """q, k, v [B, T, H, D] -> float64 output [B, T, H, D] and the exact-pair count per head."""
    q, k, v = q.double(), k.double(), v.double()
    b_, t, h_, d = q.shape
    scale = d ** -0.5 if scale is None else scale
    c = scale * math.log2(math.e)
    n = math.ceil(t / BLOCK)
    spans = [(j * BLOCK, min(t, (j + 1) * BLOCK)) for j in range(n)]
    forced = always_exact_blocks(t, sink_tokens, sink_start)
    out = torch.zeros(b_, t, h_, d, dtype=torch.float64)
    pairs = [0] * h_
    for b in range(b_):
        for h in range(h_):
            Q, K, V = q[b, :, h], k[b, :, h], v[b, :, h]
            kc = torch.stack([K[a:e].mean(0) for a, e in spans])
            vc = torch.stack([V[a:e].sum(0) for a, e in spans])
            qbar = torch.stack([Q[a:e].mean(0) for a, e in spans])
            mu = kc.mean(0)
            if thresh_type == "diag":
                var = ((kc - mu) ** 2).mean(0)
                sig2 = [float((qbar[i] ** 2 * var).sum()) for i in range(n)]
            else:
                m = kc.T @ kc / n
                sig2 = [max(float(qbar[i] @ m @ qbar[i] - (qbar[i] @ mu) ** 2), 0.0) for i in range(n)]
            for i, (a, e) in enumerate(spans):
                thr = c * float(qbar[i] @ mu) + tau * math.sqrt(c * c * sig2[i] + 1e-6)
                exact = [j in forced[i] or c * float(qbar[i] @ kc[j]) > thr for j in range(n)]
                pairs[h] += sum(exact)
                for row in range(a, e):
                    logits, values, weights = [], [], []
                    for j, (ka, ke) in enumerate(spans):
                        if exact[j]:
                            logits.append(c * (K[ka:ke] @ Q[row]))
                            values.append(V[ka:ke])
                            weights.append(torch.ones(ke - ka, dtype=torch.float64))
                        else:  # rank-1 correction: every key of the block taken as kc_j
                            logits.append((c * (kc[j] @ Q[row])).reshape(1))
                            values.append(vc[j][None])
                            weights.append(torch.tensor([float(ke - ka)], dtype=torch.float64))
                    lg = torch.cat(logits)
                    p = torch.exp2(lg - lg.max())
                    num = (p[:, None] * torch.cat(values)).sum(0)
                    den = (p * torch.cat(weights)).sum()
                    out[b, row, h] = num / den
    return out, pairs

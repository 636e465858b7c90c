"""SanaVideo2Transformer3DModel against a direct restatement of the release formulas (sana_video2.md §4-6,
sana_video2_checkpoint.md §3), in float64. The restatement below is written from the reference text, reading the
model's parameters by their original checkpoint names and none of the model's functions."""
import math

import pytest
import torch

from accelpatch.models.sana_video2.modeling import anchor_layer_indices
from accelpatch.testing import sana_video2_transformer_inputs, tiny_sana_video2_transformer

TOL = dict(atol=1e-10, rtol=1e-10)


@pytest.fixture(scope="module")
def model():
    m = tiny_sana_video2_transformer().double()
    with torch.no_grad():  # non-trivial values where the release initialises constants
        for name, p in m.named_parameters():
            if name.endswith(("norm.weight", "o_norm.weight", "y_norm.weight")):
                p.copy_(1 + 0.3 * torch.randn_like(p))
    return m


def P(model, name):
    return dict(model.named_parameters())[name]


def linear(model, prefix, x, bias=True):
    out = x @ P(model, f"{prefix}.weight").T
    return out + P(model, f"{prefix}.bias") if bias else out


def rmsnorm(x, weight, eps, dim=-1):
    shape = [1] * x.dim()
    shape[dim] = -1
    return weight.view(shape) * x * torch.rsqrt(x.pow(2).mean(dim, keepdim=True) + eps)


def layernorm(x, eps=1e-6):
    mu = x.mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(((x - mu) ** 2).mean(-1, keepdim=True) + eps)


def rope_angles(head_dim, frames, height, width):
    """[N, head_dim/2] angles: per axis ω_j = 10000^(-2j/dim_axis), t/h/w dims d-4(d//6), 2(d//6), 2(d//6)."""
    side = 2 * (head_dim // 6)
    dims = (head_dim - 2 * side, side, side)
    rows = []
    for f in range(frames):
        for h in range(height):
            for w in range(width):
                parts = []
                for pos, dim in zip((f, h, w), dims):
                    j = torch.arange(dim // 2, dtype=torch.float64)
                    parts.append(pos * 10000.0 ** (-2 * j / dim))
                rows.append(torch.cat(parts))
    return torch.stack(rows)


def rotate(x, angles):
    """Rotate adjacent pairs (2i, 2i+1) of x [B, N, H, D] by angles [N, D/2]."""
    a, b = x[..., 0::2], x[..., 1::2]
    cos, sin = torch.cos(angles)[None, :, None], torch.sin(angles)[None, :, None]
    out = torch.empty_like(x)
    out[..., 0::2] = a * cos - b * sin
    out[..., 1::2] = a * sin + b * cos
    return out


def self_attention(model, layer, x, grid):
    pre = f"blocks.{layer}.attn"
    c = x.shape[-1]
    qkv = x @ P(model, f"{pre}.qkv.weight").T
    q, k, v = qkv[..., :c], qkv[..., c:2 * c], qkv[..., 2 * c:]
    q = rmsnorm(q, P(model, f"{pre}.q_norm.weight"), 1e-5)
    k = rmsnorm(k, P(model, f"{pre}.k_norm.weight"), 1e-5)
    gate = torch.sigmoid(linear(model, f"{pre}.output_gate", x))
    batch, n, _ = x.shape
    if layer in model.softmax_layer_indices:  # §4
        d = model.config.softmax_head_dim
        q, k, v = (t.reshape(batch, n, c // d, d) for t in (q, k, v))
        ang = rope_angles(d, *grid)
        q, k = rotate(q, ang), rotate(k, ang)
        scores = torch.einsum("bnhd,bmhd->bhnm", q, k) / math.sqrt(d)
        out = torch.einsum("bhnm,bmhd->bnhd", torch.softmax(scores, -1), v).reshape(batch, n, c)
    else:  # §5
        d = model.config.linear_head_dim
        heads = c // d
        q, k, v = (t.reshape(batch, n, heads, d) for t in (q, k, v))
        ang = rope_angles(d, *grid)
        beta = torch.sigmoid(linear(model, f"{pre}.beta_proj", x))  # [B, N, H]
        kg = rotate(k, ang) * beta[..., None]
        qr = rotate(q, ang)
        kv = torch.einsum("bmhd,bmhe->bhde", v, kg)  # Σ_tokens v kᵀ, per head
        num = torch.einsum("bhde,bnhe->bnhd", kv, qr)
        denom = torch.einsum("bmhd,bnhd->bnh", torch.relu(k), torch.relu(q)) + 1e-8
        out = num / denom[..., None]
        out = rmsnorm(out, P(model, f"{pre}.o_norm.weight"), 1e-5).reshape(batch, n, c)
    return linear(model, f"{pre}.proj", out * gate)


def cross_attention(model, layer, x, y, mask):
    pre = f"blocks.{layer}.cross_attn"
    c, heads = x.shape[-1], model.config.num_heads
    q = rmsnorm(linear(model, f"{pre}.q_linear", x), P(model, f"{pre}.q_norm.weight"), 1e-6)
    kv = linear(model, f"{pre}.kv_linear", y)
    k = rmsnorm(kv[..., :c], P(model, f"{pre}.k_norm.weight"), 1e-6)
    v = kv[..., c:]
    b, n, l = x.shape[0], x.shape[1], y.shape[1]
    q, k, v = q.reshape(b, n, heads, -1), k.reshape(b, l, heads, -1), v.reshape(b, l, heads, -1)
    scores = torch.einsum("bnhd,blhd->bhnl", q, k) / math.sqrt(c // heads)
    scores = scores + ((1 - mask.double()) * -10000.0)[:, None, None, :]
    out = torch.einsum("bhnl,blhd->bnhd", torch.softmax(scores, -1), v).reshape(b, n, c)
    return linear(model, f"{pre}.proj", out)


def restated_forward(model, inputs):
    """§3.1-3.9 for timesteps [B] or [B, 1, F, 1, 1] (per frame)."""
    cfg = model.config
    x_in, y, t_in, mask = (inputs[k] for k in ("hidden_states", "encoder_hidden_states", "timestep",
                                               "encoder_attention_mask"))
    batch, cin, frames, height, width = x_in.shape
    per_frame = t_in.dim() == 5
    t = t_in.reshape(batch, frames) if per_frame else t_in[:, None]  # [B, G] groups of frames
    t = t.long().float()  # truncation to integers (timestep_norm_scale_factor == 1)
    half = 128  # the release computes the sinusoid in float32, then casts it to the model's dtype
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float32) / half)
    args = t[..., None] * freqs
    t_freq = torch.cat([torch.cos(args), torch.sin(args)], -1).double()  # cos first
    temb = linear(model, "t_embedder.mlp.2", torch.nn.functional.silu(linear(model, "t_embedder.mlp.0", t_freq)))
    t0 = linear(model, "t_block.1", torch.nn.functional.silu(temb))  # [B, G, 6C]
    c = cfg.hidden_size

    cap = linear(model, "y_embedder.y_proj.fc2",
                 torch.nn.functional.gelu(linear(model, "y_embedder.y_proj.fc1", y), approximate="tanh"))
    cap = rmsnorm(cap, P(model, "attention_y_norm.weight"), 1e-5)

    w = P(model, "x_embedder.proj.weight").reshape(c, cin)
    x = torch.einsum("bcfhw,oc->bfhwo", x_in, w).reshape(batch, -1, c) + P(model, "x_embedder.proj.bias")
    n = x.shape[1]
    groups = t.shape[1]

    def grouped(v):  # tokens [B, N, C] -> [B, G, N/G, C]
        return v.reshape(batch, groups, n // groups, c)

    def mix(proj, sources):  # §3.8
        if len(sources) == 1:
            return sources[0]
        vals = torch.stack(sources)
        keys = vals * torch.rsqrt(vals.pow(2).mean(-1, keepdim=True) + 1e-6)
        weights = torch.softmax((keys * P(model, f"attn_res.{proj}.weight")[0]).sum(-1), dim=0)
        return (weights[..., None] * vals).sum(0)

    done, partial = [x], None
    for i in range(cfg.depth):
        table = P(model, f"blocks.{i}.scale_shift_table")
        mod = (table + t0.reshape(batch, groups, 6, c))[:, :, :, None, :]  # [B, G, 6, 1, C]
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = mod.unbind(2)
        h = mix("attn_proj", done + ([partial] if partial is not None else []))
        a_in = (grouped(layernorm(h)) * (1 + scale_msa) + shift_msa).reshape(batch, n, c)
        a = (gate_msa * grouped(self_attention(model, i, a_in, (frames, height, width)))).reshape(batch, n, c)
        delta = a + cross_attention(model, i, h + a, cap, mask)
        partial = delta if partial is None else partial + delta
        h2 = mix("mlp_proj", done + [partial])
        m_in = (grouped(layernorm(h2)) * (1 + scale_mlp) + shift_mlp).reshape(batch, n, c)
        gate_h = torch.nn.functional.silu(linear(model, f"blocks.{i}.mlp.gate_proj", m_in))
        mlp = linear(model, f"blocks.{i}.mlp.down_proj", gate_h * linear(model, f"blocks.{i}.mlp.up_proj", m_in))
        partial = partial + (gate_mlp * grouped(mlp)).reshape(batch, n, c)
        if (i + 1) % cfg.attn_res_block_size == 0 or i + 1 == cfg.depth:
            done.append(partial)
            partial = None
    x = mix("final_proj", done)
    shift, scale = (P(model, "final_layer.scale_shift_table")[None, None] + temb[:, :, None, :]).unbind(2)
    x = (grouped(layernorm(x)) * (1 + scale[:, :, None]) + shift[:, :, None]).reshape(batch, n, c)
    out = linear(model, "final_layer.linear", x)  # [B, N, Cout]
    return out.transpose(1, 2).reshape(batch, -1, frames, height, width)


def _inputs(model, **kwargs):
    return {k: (v.double() if v.is_floating_point() else v)
            for k, v in sana_video2_transformer_inputs(model, **kwargs).items()}


@pytest.mark.parametrize("per_frame", [False, True], ids=["timestep-per-item", "timestep-per-frame"])
def test_the_whole_forward_equals_the_restated_formulas(model, per_frame):
    inputs = _inputs(model, per_frame_timesteps=per_frame)
    with torch.no_grad():
        ours = model(**inputs).sample
    torch.testing.assert_close(ours, restated_forward(model, inputs), **TOL)
    assert inputs["encoder_attention_mask"].min() == 0  # the text mask takes part


def test_training_mode_path_equals_the_inference_path(model):
    """With autograd on, the residual sources are stacked instead of buffered: the same numbers."""
    inputs = _inputs(model)
    with torch.no_grad():
        buffered = model(**inputs).sample
    stacked = model(**inputs).sample
    assert torch.equal(buffered, stacked.detach())


@pytest.mark.parametrize("layer", [0, 3], ids=["linear", "anchor"])
def test_each_self_attention_kind_equals_its_formula(model, layer):
    inputs = _inputs(model)
    g = torch.Generator().manual_seed(layer)
    x = torch.randn(2, 72, model.config.hidden_size, generator=g, dtype=torch.float64)
    attn = model.blocks[layer].attn
    head_dim = attn.head_dim
    rope = model.rope_softmax if layer in model.softmax_layer_indices else model.rope_linear
    with torch.no_grad():
        ours = attn(x, rope(3, 4, 6, x.device))
    torch.testing.assert_close(ours, self_attention(model, layer, x, (3, 4, 6)), **TOL)
    assert head_dim == (32 if layer == 3 else 16) and inputs


def test_the_linear_attention_normaliser_matters_only_through_its_epsilon(model):
    """Release detail: the ReLU-kernel normaliser is a positive per-(token, head) scalar that o_norm cancels except
    for epsilons; the model keeps it, and the result differs from dropping it by far less than the signal."""
    x = torch.randn(1, 72, model.config.hidden_size, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    attn = model.blocks[0].attn
    rope = model.rope_linear(3, 4, 6, x.device)
    with torch.no_grad():
        with_normaliser = attn(x, rope)
        eps = attn.o_norm.eps
        attn.o_norm.eps = 0.0
        no_eps = attn(x, rope)
        attn.o_norm.eps = eps
    assert not torch.equal(with_normaliser, no_eps)
    assert (with_normaliser - no_eps).abs().max() < 1e-2 * with_normaliser.abs().max()


def test_timesteps_are_truncated_to_integers(model):
    inputs = _inputs(model)
    with torch.no_grad():
        a = model(**inputs).sample
        b = model(**dict(inputs, timestep=inputs["timestep"].floor() + 0.99)).sample
        c = model(**dict(inputs, timestep=inputs["timestep"].floor() + 1.0)).sample
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_timestep_shapes_per_frame_are_equivalent(model):
    inputs = _inputs(model, per_frame_timesteps=True)
    five_d = inputs["timestep"]
    with torch.no_grad():
        reference = model(**inputs).sample
        for t in (five_d.reshape(2, 3), five_d.reshape(2, 1, 3)):
            assert torch.equal(model(**dict(inputs, timestep=t)).sample, reference)
        caption_4d = inputs["encoder_hidden_states"][:, None]
        assert torch.equal(model(**dict(inputs, encoder_hidden_states=caption_4d)).sample, reference)
    with pytest.raises(ValueError, match=r"timestep must be \[B\], or per frame"):
        model(**dict(inputs, timestep=torch.zeros(2, 4)))


@pytest.mark.parametrize("depth, ratio, expected", [
    (4, 0.25, [3]), (4, 0.5, [1, 3]), (32, 0.25, [3, 7, 11, 15, 19, 23, 27, 31]),
    (40, 0.25, [3, 7, 11, 15, 19, 23, 27, 31, 35, 39]), (1, 0.25, [0]), (10, 0.25, [4, 9]),
])
def test_anchor_rule(depth, ratio, expected):
    assert anchor_layer_indices(depth, ratio) == expected


def test_anchor_rule_refuses_bad_values():
    with pytest.raises(ValueError, match="softmax_ratio must be in"):
        anchor_layer_indices(4, 0.0)
    with pytest.raises(ValueError, match="depth must be an int"):
        anchor_layer_indices(0, 0.25)

"""The fused Triton kernels on a GPU: bit identity with the eager reference chains at SANA-Video's widths, and time.

For each case (the AOT cases' ops and dtypes, accelpatch.lossless.aot) it builds random inputs with edge values
(NaN, +-inf, +-0.0, subnormals, ties), runs reference and kernel, compares raw bits, NaN positions, dtype, shape and
strides, and times both (CUDA events, median of --reps after a warm-up). Exit status 1 on any mismatch. It first
prints which form the device's eager complex128 multiply takes in each loop (the fact sheet's open question 1).
This is the check a CPU-only machine cannot make (there the kernels run only in the interpreter, against eager CPU).
Run on a GPU:  python benchmarks/bench_fused_triton_cuda.py [--tokens 32760] [--reps 20]
Smoke run on CPU (interpreter, slow: its times mean nothing):
  TRITON_INTERPRET=1 python benchmarks/bench_fused_triton_cuda.py --device cpu --tokens 1 --reps 1
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

BITS = {2: torch.int16, 4: torch.int32, 8: torch.int64}


def edge(shape, dtype, seed, device):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g)
    flat = x.view(-1)
    flat[0::97] = (torch.randint(-600, 600, flat[0::97].shape, generator=g) / 256.0)  # ties after products
    specials = torch.tensor([float("nan"), float("inf"), float("-inf"), 0.0, -0.0, 1e-39, -3e-40])
    flat[: specials.numel()] = specials[: flat.numel()]
    return x.to(dtype).to(device)


def mismatches(got, want) -> str:
    """'' when bit-identical (NaN: same positions), else what differs."""
    outs = zip(got, want) if isinstance(got, tuple) else [(got, want)]
    for i, (g, w) in enumerate(outs):
        if (g.dtype, g.shape, g.stride()) != (w.dtype, w.shape, w.stride()):
            return f"output {i}: {g.dtype} {tuple(g.shape)} {g.stride()} vs {w.dtype} {tuple(w.shape)} {w.stride()}"
        nan = w.isnan()
        if not torch.equal(g.isnan(), nan):
            return f"output {i}: NaN positions differ"
        differ = int(((g.view(BITS[g.element_size()]) != w.view(BITS[w.element_size()])) & ~nan).sum())
        if differ:
            return f"output {i}: {differ} of {g.numel()} elements differ"
    return ""


def _name(dtype):
    return str(dtype).replace("torch.", "")


def cases(tokens, device):
    bf16, fp16, fp32, fp64 = torch.bfloat16, torch.float16, torch.float32, torch.float64
    e = lambda shape, dtype, seed: edge(shape, dtype, seed, device)  # noqa: E731
    out = []
    for q_dtype, t_dtype in ((bf16, fp32), (bf16, bf16), (bf16, fp64), (fp32, fp32)):
        q, k = e((2, tokens, 20, 112), q_dtype, 1), e((2, tokens, 20, 112), q_dtype, 2)
        theta = torch.arange(tokens, dtype=fp64, device=device)[:, None] * torch.rand(112, dtype=fp64, device=device)
        out.append((f"relu_rope_pair {_name(q_dtype)} q, {_name(t_dtype)} tables", "relu_rope_pair",
                    (q, k, theta.cos()[None, :, None].to(t_dtype), theta.sin()[None, :, None].to(t_dtype))))
    for dtype in (bf16, fp16, fp32):
        x, rows = e((2, tokens, 2240), dtype, 3), e((2, 1, 6, 2240), dtype, 4)
        out.append((f"modulate {_name(dtype)}", "modulate", (x, rows[:, :, 1], rows[:, :, 0])))
        out.append((f"gated_residual {_name(dtype)}", "gated_residual",
                    (e((2, tokens, 2240), dtype, 5), rows[:, :, 2], x)))
    residual = e((2, 2240, tokens), bf16, 6).transpose(1, 2)
    out.append(("gated_residual bf16, transposed residual", "gated_residual",
                (residual, e((2, 1, 2240), bf16, 7), e((2, tokens, 2240), bf16, 8))))
    conv = e((2, 11200, tokens, 8), bf16, 9).to(memory_format=torch.channels_last)
    out.append(("silu bf16 channels_last", "silu", (conv,)))
    out.append(("glu_gate bf16 channels_last chunks", "glu_gate", conv.chunk(2, dim=1)))
    for z_dtype, dtype in ((bf16, bf16), (bf16, fp16), (fp32, bf16), (fp16, bf16)):
        out.append((f"scale_to_tokens fp32 x {_name(z_dtype)} z -> {_name(dtype)}", "scale_to_tokens",
                    (e((2, 20, 112, tokens), fp32, 10), e((2, 20, 1, tokens), z_dtype, 11), dtype)))
    for dtype in (bf16, fp32):  # MiniMax-H3: 56 heads x 128, rotary dim 96, fp32 [S, 96] tables, batch 1
        theta = torch.arange(tokens, dtype=fp32, device=device)[:, None] * torch.rand(48, device=device)
        theta = torch.cat((theta, theta), -1)
        out.append((f"rotate_half_pair {_name(dtype)}, fp32 tables", "rotate_half_pair",
                    (e((1, tokens, 56, 128), dtype, 12), e((1, tokens, 56, 128), dtype, 13), theta.cos(),
                     theta.sin())))
    for dtype in (bf16, fp32, fp64):  # SANA-Video 2.0: q, k chunks of the fused qkv, 20 heads x 128
        q, k, _ = (t.unflatten(-1, (20, 128)) for t in e((2, tokens, 3 * 2560), dtype, 14).chunk(3, dim=-1))
        angle = torch.arange(tokens, dtype=fp64, device=device)[:, None] * torch.rand(64, dtype=fp64, device=device)
        out.append((f"rotary_complex_pair {_name(dtype)} qkv chunks", "rotary_complex_pair",
                    (q, k, torch.polar(torch.ones_like(angle), angle))))
    return out


def timed(fn, reps, device):
    if device.type != "cuda":
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e3
    fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tokens", type=int, default=32760, help="tokens per sample (SANA-Video 480p: 32,760)")
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    torch.set_num_threads(1)

    import accelpatch.lossless.ops  # noqa: F401, PLC0415 - registers the ops
    from accelpatch.lossless.kernels import complex_mul  # noqa: PLC0415
    from accelpatch.lossless.verify import ops  # noqa: PLC0415

    print("eager complex128 multiply on this device (0 every product rounded, 1/2 fma on the first/second product):",
          complex_mul.loop_modes(device), flush=True)
    failed = False
    print(f"{'case':<50} {'eager_ms':>9} {'fused_ms':>9} {'ratio':>6}  result")
    with torch.no_grad():
        for label, op, inputs in cases(args.tokens, device):
            kernel = ops()[op].kernels["cuda"]
            reason = kernel.unsupported(*inputs)
            if reason:
                print(f"{label:<50} refused: {reason}", flush=True)
                continue
            fused, ref = kernel.run, ops()[op].reference
            problem = mismatches(fused(*inputs), ref(*inputs))
            failed |= bool(problem)
            t_ref = timed(lambda: ref(*inputs), args.reps, device)  # noqa: B023
            t_fused = timed(lambda: fused(*inputs), args.reps, device)  # noqa: B023
            print(f"{label:<50} {t_ref:>9.3f} {t_fused:>9.3f} {t_ref / t_fused:>6.2f}  "
                  f"{problem or 'bit-identical'}", flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()

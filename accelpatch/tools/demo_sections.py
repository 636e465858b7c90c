"""The demo's sections, one per registered model family (:data:`MODELS`, from :mod:`accelpatch.models.families`), and
how each runs: :func:`sana_section` (a diffusers pipeline unpatched and under every tier) and
:func:`sol_attn_section` (unpatched next to ``backend="sol_attn"``, and one ``quality("lossless")`` call: MiniMax-H3's
modular pipeline and the diffusers pipelines of Wan, HunyuanVideo 1.5 and LTX-2). Their rows, rounds and table:
:mod:`accelpatch.tools.demo_rows`. Importing this module imports neither torch nor diffusers.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Any, Optional

from accelpatch.models.families import families
from accelpatch.tools.demo_rows import (MIN_ROUNDS, Row, count_calls, median, plural, removal_line, row_quality,
                                        run_rounds, table_lines)


@dataclass(frozen=True)
class DemoModel:
    """One section of the demo: its title, how its tiny pipeline is built and called (names in
    :mod:`accelpatch.testing`; ``transformer_config`` None is the builder's default), the family (``"sana"``: a
    diffusers pipeline run through every tier; ``"minimax-h3"``: the modular pipeline with the ``sol_attn``
    backend; ``"sol"``: a diffusers pipeline with the ``sol_attn`` backend), its defaults (denoising steps per call,
    interleaved timing rounds: cheap calls get more), ``outputs``: the attributes of a diffusers pipeline's output
    that must stay bit-identical (LTX-2's audio too), and ``call_size``: call arguments over the call-kwargs
    builder's defaults (None: the builder's size, 1,024 video tokens per forward for Wan, HunyuanVideo 1.5, LTX-2)."""

    title: str
    family: str
    pipeline: str
    call_kwargs: str
    transformer_config: Optional[str]
    default_steps: int
    default_rounds: int
    outputs: tuple[str, ...] = ("frames",)
    call_size: Optional[dict] = field(default=None, hash=False)


#: ``--model`` choices, one per registered family (accelpatch.models.families: each family's package says how its
#: section runs), in the order ``all`` runs them. The transformer configs keep the released head dims, so
#: head-dim-gated fast paths apply (Wan, HunyuanVideo 1.5, LTX-2: their builders' default Sol configs, head dim 128,
#: 1,024 video tokens per forward at the default call size).
MODELS: dict[str, DemoModel] = {
    family.cli: DemoModel(family.name, family.demo.kind, f"tiny_{family.key}_pipeline",
                          f"{family.key}_pipeline_call_kwargs", family.demo.transformer_config, family.demo.steps,
                          family.demo.rounds, family.demo.outputs)
    for family in families()}
#: What a plain ``python -m accelpatch demo`` runs: the SANA-Video tiers next to the MiniMax-H3 sol_attn path (one
#: family whose fast path needs CUDA, one whose fast path runs here); the other four are a ``--model`` away.
DEFAULT_MODELS = ("sana-video", "minimax-h3")
#: seconds of start-up before the first section (imports, the first build)
START_UP_S = 4


def default_help() -> str:
    """What ``--help`` says of the default sections and of the rest: each family's measured time and the CPU it was
    measured on (its registration's ``DemoSettings``; docs/cli.md says the same). Each section prints its own time,
    and a busy machine stretches them."""
    found = {family.cli: family.demo for family in families()}

    def timed(cli: str) -> str:
        return f"{cli} ~{found[cli].seconds} s" if found[cli].seconds else f"{cli} (not timed yet)"

    def minutes(seconds: int) -> str:
        return f"~{seconds // 60} min {seconds % 60} s" if seconds >= 60 else f"~{seconds} s"

    default = START_UP_S + sum(found[cli].seconds or 0 for cli in DEFAULT_MODELS)
    every = START_UP_S + sum(demo.seconds or 0 for demo in found.values())
    cpus = {}
    for cli, demo in found.items():
        cpus.setdefault(demo.measured_on, []).append(cli)
    (usual, _), *rest = sorted(cpus.items(), key=lambda kv: -len(kv[1]))
    where = f"one thread on {usual}" + "".join(f" ({', '.join(clis)}: {cpu})" for cpu, clis in rest)
    return (f"{' and '.join(map(timed, DEFAULT_MODELS))} (the SANA-Video tiers, and the MiniMax-H3 sol_attn path, "
            f"which runs on CPU); {minutes(default)} with start-up. The others run only when named: "
            f"{', '.join(timed(cli) for cli in found if cli not in DEFAULT_MODELS)}; all {minutes(every)}. Measured "
            f"with {where}; each section prints its own time")


def parse_models(text: str) -> tuple[str, ...]:
    """argparse type for ``--model``: one name of :data:`MODELS`, a comma list of them (in the order given), or
    ``all`` (every section, in :data:`MODELS`' order)."""
    names = tuple(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))
    if "all" in names:
        names = tuple(dict.fromkeys([*(n for n in names if n != "all"), *MODELS]))
    unknown = [n for n in names if n not in MODELS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"invalid choice: {', '.join(map(repr, unknown)) or repr(text)} "
                                         f"(choose from {', '.join(MODELS)}, all, or a comma list of them)")
    return names


#: The MiniMax-H3 section's transformer: MINIMAX_H3_MEDIUM_CONFIG (4 layers, head dim 128, hidden 128) with 2 heads,
#: which halves the cost of a forward and leaves room for a longer sequence.
H3_CONFIG_OVERRIDES: dict[str, Any] = {"num_attention_heads": 2}
#: 256x384, 124 frames (the shortest clip the pipeline takes): 3,552 video rows after 5 text and 414 audio rows. At
#: this length block sparsity pays on one CPU thread (Sol-Attn computes ~25% of the key blocks exactly); the sparse
#: attention's advantage grows with the sequence (about 1.4x per layer at 2.8k rows, 1.7x at 4k, 2.2x at 5.7k, one
#: thread). The section runs one denoising step per call (its default): ~0.9 s of transformer and ~1.4 s of VAE
#: decode per call on a 2-core AVX2 EPYC, 14 calls; at the former 2 steps it took 48 s idle, 2:44 under load.
H3_CALL_SIZE: dict[str, int] = {"height": 256, "width": 384, "num_frames": 124}
#: Options of ``apply(pipe, backend="sol_attn", ...)`` in the sol_attn sections; tau (1.0) and the thresholds stay
#: at their defaults. The default dense_steps=0.2 (the first 20 % of a call's steps, rounded up) keeps the one step
#: of these one-step calls dense (0 fast calls); the default min_tokens floor (12,288) is above every toy sequence.
#: The default dense layers (0 and 1) are 2 of a released model's 30-60 layers but half or all of these 2-4-layer
#: toys, so the toys run every layer sparse, closer to the release's ~96% sparse layers.
SOL_OPTIONS: dict[str, Any] = {"dense_steps": 0, "dense_layers": "", "min_tokens": 0}


def _sol_option_reasons(layers: int) -> str:
    """Why each of :data:`SOL_OPTIONS` differs from its default, for a section header."""
    return ("dense_steps=0: the default 20 % of the steps rounds up to the one step of these calls; min_tokens=0: "
            "the default floor of 12,288 tokens is above these toys' sequences; dense_layers='': the "
            f"default 0,1 is 2 of a release's 30-60 layers but {'all' if layers <= 2 else 'half' if layers == 4 else 2}"
            f" of this {layers}-layer toy")


def sana_section(spec: DemoModel, *, steps: int, dtype, device: str, seed: int, rounds: int, progress: bool
                 ) -> list[str]:
    """A diffusers SANA pipeline unpatched and under every tier (default, exact, lossless, high)."""
    from tqdm.auto import tqdm  # noqa: PLC0415

    import accelpatch.testing as testing  # noqa: PLC0415

    build_pipeline, call_kwargs = getattr(testing, spec.pipeline), getattr(testing, spec.call_kwargs)
    config = None if spec.transformer_config is None else getattr(testing, spec.transformer_config)
    rows = [Row("unpatched", False), Row("patched, default", True), Row("patched, exact", True, "exact"),
            Row("patched, lossless", True, "lossless"), Row("patched, high", True, "high")]
    bar = tqdm(total=2 + count_calls(rows, rounds), desc=spec.title, disable=not progress, unit="call")
    bar.set_postfix_str("building the tiny pipeline")
    pipe = build_pipeline(dtype=dtype, seed=seed, device=device, transformer_config=config)
    bar.update(1)
    call = lambda: pipe(**call_kwargs(num_inference_steps=steps, seed=seed)).frames  # noqa: E731
    bar.set_postfix_str("warm-up (the reference frames)")
    reference = call()
    bar.update(1)
    seen = run_rounds(pipe, rows, call, reference, rounds=rounds, apply_options={}, bar=bar)
    bar.close()
    lines = [f"== {spec.title}: tiny random pipeline, {steps} steps, CFG (batch 2), frames {tuple(reference.shape)}, "
             f"{plural(rounds, 'interleaved round')}",
             "   accelpatch.apply(pipe), then each tier by `with accelpatch.quality(tier)`", ""]
    lines += table_lines(rows, reference, rounds)
    lines += ["", "accelpatch.report(pipe) after one call at the default tier:", seen.site_report or "-", "",
              removal_line(seen.after_remove, seen.after_remove_identical)]
    return lines


def _build_h3(spec: DemoModel, *, steps: int, dtype, device: str, seed: int):
    """The MiniMax-H3 modular t2va pipeline at :data:`H3_CALL_SIZE` and a call returning its video."""
    import torch  # noqa: PLC0415

    import accelpatch.testing as testing  # noqa: PLC0415

    config = {**getattr(testing, spec.transformer_config), **H3_CONFIG_OVERRIDES}
    transformer = testing.tiny_minimax_h3_transformer(config, dtype=dtype, seed=seed, device=device)
    pipe = getattr(testing, spec.pipeline)(transformer=transformer, seed=seed)
    if torch.device(device).type != "cpu":
        pipe.to(device)

    def call():
        kwargs = getattr(testing, spec.call_kwargs)(num_inference_steps=steps + 1, pipeline=pipe, seed=seed,
                                                    **H3_CALL_SIZE)
        kwargs["prompt_embeds"] = kwargs["prompt_embeds"].to(device)
        return pipe(**kwargs, output="videos")

    return pipe, call


def _build_diffusers(spec: DemoModel, *, steps: int, dtype, device: str, seed: int):
    """A tiny diffusers pipeline (Wan, HunyuanVideo 1.5, LTX-2) at its call-kwargs builder's default size and a call
    returning its frames, or a tuple of :attr:`DemoModel.outputs` (LTX-2: frames and audio)."""
    import accelpatch.testing as testing  # noqa: PLC0415

    config = None if spec.transformer_config is None else getattr(testing, spec.transformer_config)
    pipe = getattr(testing, spec.pipeline)(dtype=dtype, seed=seed, device=device, transformer_config=config)
    call_kwargs = getattr(testing, spec.call_kwargs)

    def call():
        out = pipe(**call_kwargs(num_inference_steps=steps, seed=seed, **(spec.call_size or {})))
        values = tuple(getattr(out, name) for name in spec.outputs)
        return values if len(values) > 1 else values[0]

    return pipe, call


def _video_tokens(hidden_states, config) -> int:
    """Video tokens per forward from the transformer's ``hidden_states``: patchified (B, S, C) as LTX-2 takes them,
    or latents (B, C, F, H, W) cut into ``patch_size`` (Wan's (1, 2, 2); HunyuanVideo 1.5's ``patch_size_t`` x
    ``patch_size``²)."""
    if hidden_states.ndim == 3:
        return int(hidden_states.shape[1])
    patch = config.patch_size
    if isinstance(patch, (tuple, list)):
        pt, ph, pw = patch
    else:
        pt, ph, pw = getattr(config, "patch_size_t", 1), patch, patch
    frames, height, width = hidden_states.shape[2:]
    return (frames // pt) * (height // ph) * (width // pw)


def _shape(output) -> str:
    """The call output's shape(s): frames, and ``audio (…)`` for a tuple."""
    if isinstance(output, tuple):
        return f"frames {tuple(output[0].shape)}, audio {tuple(output[1].shape)}"
    return f"frames {tuple(output.shape)}"


def sol_attn_section(spec: DemoModel, *, steps: int, dtype, device: str, seed: int, rounds: int, progress: bool
                     ) -> list[str]:
    """A pipeline unpatched and with ``backend="sol_attn"`` (tier high, its default), timed, plus one
    ``quality("lossless")`` call; closes with the Sol-Attn verdict (speed-up with its interval, or noise) and the
    bit-identity checks. MiniMax-H3 (the modular pipeline) and the diffusers pipelines Wan, HunyuanVideo 1.5 and LTX-2
    differ only in how they are built and called and in the header's sequence line."""
    from tqdm.auto import tqdm  # noqa: PLC0415

    import accelpatch.testing as testing  # noqa: PLC0415
    from accelpatch.eval.stats import compare_timings  # noqa: PLC0415

    h3 = spec.family == "minimax-h3"
    rows = [Row("unpatched", False), Row("sol_attn (high)", True), Row("sol_attn, lossless", True, "lossless", False)]
    bar = tqdm(total=2 + count_calls(rows, rounds), desc=spec.title, disable=not progress, unit="call")
    bar.set_postfix_str("building the tiny pipeline")
    pipe, call = (_build_h3 if h3 else _build_diffusers)(spec, steps=steps, dtype=dtype, device=device, seed=seed)
    bar.update(1)
    captured: dict = {}
    hook = pipe.transformer.register_forward_pre_hook(lambda m, a, kw: captured.update(kw), with_kwargs=True)
    bar.set_postfix_str("warm-up (the reference frames)")
    try:
        reference = call()
    finally:
        hook.remove()
    bar.update(1)
    seen = run_rounds(pipe, rows, call, reference, rounds=rounds, apply_options={"backend": "sol_attn", **SOL_OPTIONS},
                       bar=bar)
    bar.close()

    cfg = pipe.transformer.config
    unpatched, sol, lossless = rows
    model = f"{cfg.num_layers} layers, {cfg.num_attention_heads} heads × {cfg.attention_head_dim}"
    if h3:
        layout = testing.minimax_h3_layout(captured)
        lines = [f"== {spec.title}: tiny random t2va pipeline ({model}), {H3_CALL_SIZE['height']}×"
                 f"{H3_CALL_SIZE['width']}, {H3_CALL_SIZE['num_frames']} frames, {plural(steps, 'denoising step')} "
                 f"(num_inference_steps={steps + 1}: the distilled pipeline runs one forward per step), "
                 f"{plural(rounds, 'interleaved round')}",
                 f"   packed sequence {layout.sequence_length:,} rows: {layout.num_text} text + {layout.num_audio} "
                 f"audio (the always-exact sink) + {layout.num_video:,} video"]
    else:
        lines = [f"== {spec.title}: tiny random {type(pipe).__name__} ({model}), {_shape(reference)}, "
                 f"{plural(steps, 'denoising step')} with classifier-free guidance, "
                 f"{plural(rounds, 'interleaved round')}",
                 f"   {_video_tokens(captured['hidden_states'], cfg):,} video tokens per forward in the sparse "
                 "self-attention; cross-attention and other streams stay dense (the report says which)"]
    options = ", ".join(f"{k}={v!r}" for k, v in SOL_OPTIONS.items())
    lines += [f"   accelpatch.apply(pipe, backend=\"sol_attn\", {options}); tau=1.0 (default)",
              f"   ({_sol_option_reasons(int(cfg.num_layers))})", ""]
    lines += table_lines(rows, reference, rounds)
    lines += ["", "accelpatch.report(pipe) after one sol_attn call:", seen.site_report or "-", ""]
    verdict = compare_timings(unpatched.seconds, sol.seconds)
    bench = "benchmarks/bench_minimax_h3_sol_attn.py" if h3 else "benchmarks/bench_video_sol_attn.py"
    if rounds < MIN_ROUNDS:
        lines.append(f"Sol-Attn speed: no verdict from {rounds} round(s); it takes --repeats {MIN_ROUNDS} or more")
    elif verdict.distinguishable and verdict.speedup > 1.0:
        lines.append(f"Sol-Attn speed: {verdict.describe()} per transformer forward, "
                     f"{median(unpatched.seconds):.3f} s → {median(sol.seconds):.3f} s per step on {device}")
    else:
        lines.append(f"Sol-Attn speed: {verdict.describe()}: no speed-up that this run can tell apart from the "
                     f"machine's noise (a short sequence, or a busy machine widening the interval; {bench} "
                     "measures longer sequences)")
    if not sol.identical:
        quality = row_quality(sol, reference)
        lines.append(f"Sol-Attn quality (approximate, tier high): worst-frame PSNR {quality.min_psnr:.1f} dB, "
                     f"SSIM {quality.min_ssim:.4f} against unpatched (random weights: an illustration, not a gate)")
    what = " (frames and audio)" if isinstance(reference, tuple) else ""
    lines.append(f"quality(\"lossless\") under sol_attn: bit-identical to unpatched{what}: "
                 f"{'yes' if lossless.identical else 'NO'}")
    lines.append(removal_line(seen.after_remove, seen.after_remove_identical))
    return lines

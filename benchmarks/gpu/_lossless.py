"""Section ``lossless_bit_identity``: patched at the default tier, each model is bit-identical to unpatched.

Per model (SANA-Video, SANA-Video 2.0, MiniMax-H3; tiny configs with the release head dims 112, 128/256 and 128;
bf16 on the run's device) the output of one unpatched forward is the reference. The same forward must equal it bit
for bit (``torch.equal``, and the SHA-256 of the bytes is recorded) when run a second time unpatched (the model is
deterministic here), after ``accelpatch.apply`` at the default tier, under ``quality("lossless")`` and
``quality("exact")``, with ``backend="sol_attn"`` under ``quality("lossless")`` where the model has that backend,
and after ``accelpatch.remove``. Those rows are ``required``; a mismatch in any of them makes the run exit 1.

The ``quality("high")`` row is a control, not required: its fast-call count shows that the fast paths do run on
this device, so identity at the lower tiers is not identity by absence. Every forward runs at denoising step 20,
past the FP32 steps of SANA-Video 2.0's default policy. The section fuses every call whatever its size (the default
tier's size floor, ``accelpatch.core.sites.MIN_ELEMENTS``, would leave these small inputs to the original forward,
and the kernels unchecked): a default-tier row whose fused paths did nothing fails, as identity by absence.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch

import accelpatch
from _accel import patched
from _runner import Context
from _timing import psnr, sha256_hex
from accelpatch.testing import (MINIMAX_H3_SOL_CONFIG, SANA_VIDEO2_MEDIUM_CONFIG, SANA_VIDEO_RELEASE_LIKE_CONFIG,
                                minimax_h3_transformer_inputs, sana_video2_transformer_inputs,
                                sana_video_transformer_inputs, tiny_minimax_h3_transformer,
                                tiny_sana_video2_transformer, tiny_sana_video_transformer)

DTYPE = torch.bfloat16
STEP = 20
SOL_EVERYWHERE = dict(backend="sol_attn", dense_steps=0, dense_layers="", min_tokens=0)


@dataclass(frozen=True)
class ModelCase:
    """One model family: how to build it, its forward inputs, and the options that make its fast paths run."""

    name: str
    build: Callable[[str], torch.nn.Module]
    inputs: Callable[[torch.nn.Module], dict]
    fast_options: dict = field(default_factory=dict)
    has_sol_backend: bool = False


CASES = (
    ModelCase("SANA-Video", lambda device: tiny_sana_video_transformer(
        SANA_VIDEO_RELEASE_LIKE_CONFIG, dtype=DTYPE, device=device),
        lambda model: sana_video_transformer_inputs(model, batch_size=2)),
    ModelCase("SANA-Video 2.0", lambda device: tiny_sana_video2_transformer(
        SANA_VIDEO2_MEDIUM_CONFIG, dtype=DTYPE, device=device),
        sana_video2_transformer_inputs, fast_options=dict(anchor_fp32_steps=0), has_sol_backend=True),
    ModelCase("MiniMax-H3", lambda device: tiny_minimax_h3_transformer(
        MINIMAX_H3_SOL_CONFIG, dtype=DTYPE, device=device),
        # 300 video rows: enough blocks that Sol-Attn skips some (the control must run something fast)
        lambda model: minimax_h3_transformer_inputs(model, num_video=300), fast_options=SOL_EVERYWHERE,
        has_sol_backend=True),
)


def patched_checks(case: ModelCase) -> list[tuple[str, dict, Optional[str], bool]]:
    """(label, apply options, tier or None for the model's default, identity required) for one model."""
    checks = [("apply(), default tier", {}, None, True),
              ("apply(), quality('lossless')", {}, "lossless", True),
              ("apply(), quality('exact')", {}, "exact", True)]
    if case.has_sol_backend:
        checks.append(("apply(backend='sol_attn'), quality('lossless')", SOL_EVERYWHERE, "lossless", True))
    checks.append(("control: quality('high')", case.fast_options, "high", False))
    return checks


def forward(model: torch.nn.Module, inputs: dict, tier: Optional[str] = None) -> torch.Tensor:
    """One forward's ``.sample`` at denoising step 20, under ``tier`` when given."""
    tier_block = accelpatch.quality(tier) if tier else contextlib.nullcontext()
    with torch.no_grad(), accelpatch.denoising_step(STEP), tier_block:
        return model(**inputs).sample


def compare(reference: torch.Tensor, output: torch.Tensor) -> dict[str, Any]:
    """Bit identity and hash of ``output``; how far it moved when it is not identical."""
    identical = reference.dtype == output.dtype and torch.equal(reference, output)
    row: dict[str, Any] = {"identical": identical, "sha256": sha256_hex(output)}
    if not identical:
        row["max_abs_diff"] = (output.double() - reference.double()).abs().max().item()
        row["psnr_db"] = psnr(reference, output)
    return row


def _build(ctx: Context, case: ModelCase):
    model = case.build(ctx.device)
    return model, case.inputs(model)


def lossless_bit_identity_builds(ctx: Context):
    """(model name, build of the model and its inputs) for every case, as :func:`_check_model` builds them."""
    return [(case.name, lambda case=case: _build(ctx, case)) for case in CASES]


def _check_model(ctx: Context, case: ModelCase) -> None:
    """The reference, a second unpatched run, every patched check, and the run after ``remove()``: one row each."""
    model, inputs = _build(ctx, case)
    reference = forward(model, inputs)
    ctx.add(model=case.name, check="unpatched (reference)", required=True, identical=True,
            sha256=sha256_hex(reference))
    ctx.add(model=case.name, check="unpatched, second run", required=True, **compare(reference, forward(model, inputs)))
    for label, options, tier, required in patched_checks(case):
        with patched(model, **options):
            accelpatch.report(model, reset=True)
            output = forward(model, inputs, tier)
            sites = accelpatch.report(model).sites
        fast_calls = sum(s.fast_calls for s in sites)
        high_calls = sum(s.fast_calls for s in sites if s.tier == "high")  # the approximate paths among them
        ctx.add(model=case.name, check=label, required=required, fast_calls=fast_calls, high_calls=high_calls,
                **compare(reference, output))
    ctx.add(model=case.name, check="after remove()", required=True, **compare(reference, forward(model, inputs)))


def lossless_bit_identity(ctx: Context) -> None:
    """Every model of :data:`CASES`, one after the other, every call fused whatever its size."""
    from accelpatch.core import sites

    ctx.describe(models=", ".join(case.name for case in CASES), dtype="bf16",
                 configs="SANA_VIDEO_RELEASE_LIKE_CONFIG (2 heads × 112), SANA_VIDEO2_MEDIUM_CONFIG (128 linear / "
                         "256 anchor head dims), MINIMAX_H3_SOL_CONFIG (2 heads × 128)",
                 size_floor="off (every call fused: these inputs are under the default tier's floor)")
    floor, sites.MIN_ELEMENTS = sites.MIN_ELEMENTS, 0
    try:
        for case in ctx.sweep(CASES, "models"):
            _check_model(ctx, case)
    finally:
        sites.MIN_ELEMENTS = floor


#: the rows whose fused paths must have run: identity there must not be identity by absence
MUST_FUSE = ("apply(), default tier", "apply(), quality('lossless')")


def failed_checks(rows: list[dict]) -> list[dict]:
    """The required rows that are not bit-identical, and the lossless rows where no fused path ran."""
    return [row for row in rows if row.get("required") and (
        not row.get("identical") or (row.get("check") in MUST_FUSE and row.get("fast_calls") == 0))]

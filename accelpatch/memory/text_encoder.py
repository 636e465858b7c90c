"""The text-encoder stage of a memory plan (issue #44): each text encoder a family's pipeline loads, built at its
release configuration inside ``FakeTensorMode`` and called once on the padded prompt, as the pipeline calls it.

A family names its text encoders with :class:`~accelpatch.models.families.TextEncoderCase` (in
``accelpatch.models.<key>.memory``); the stage's weights are all of them (a pipeline loads every one), its
activations the largest single call (they run one after the other). Weights are cast as ``transformers``'
``from_pretrained(torch_dtype=...)`` casts them: its ``_keep_in_fp32_modules_strict`` stay float32 in bf16 and fp16,
its ``_keep_in_fp32_modules`` in fp16 only.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

from accelpatch.models.families import TextEncoderCase, TextStageCase, resolve

__all__ = ["TextEncoderCase", "TextStageCase", "trace_text_stage", "build_text_encoder", "TextEncoderTrace",
           "trace_text_encoder",
           "cast_like_transformers", "text_encoder_summary", "quantised_text_encoders"]


@dataclass(frozen=True)
class TextEncoderTrace:
    """What one traced text encoder holds: its weights and parameters, and the peak of its call's live tensors (the
    token ids included), in bytes."""

    name: str
    weights: int
    activations: int
    parameters: int
    tokens: int
    notes: tuple[str, ...] = field(default_factory=tuple)


def cast_like_transformers(model, dtype) -> None:
    """Cast floating parameters and buffers to ``dtype`` except the modules ``transformers`` keeps in float32 on a
    ``from_pretrained(torch_dtype=dtype)`` load (matched as substrings of the tensor's name)."""
    import torch

    from accelpatch.testing._common import _cast_like_from_pretrained

    keep = set(getattr(model, "_keep_in_fp32_modules_strict", None) or ())
    if dtype == torch.float16:
        keep |= set(getattr(model, "_keep_in_fp32_modules", None) or ())
    _cast_like_from_pretrained(model, dtype, keep)


def build_text_encoder(case: TextEncoderCase, dtype):
    """The encoder as ``from_pretrained(torch_dtype=dtype)`` leaves it, its weights random (call it inside a fake
    or meta mode: nothing is downloaded)."""
    from transformers.initialization import no_init_weights

    config = resolve(case.config_class)(**dict(case.settings))
    with no_init_weights():  # random values are not needed (and a fake tensor cannot be truncated-normal drawn)
        model = resolve(case.model)(config).eval()
    model.tie_weights()  # what from_pretrained ties (no_init_weights skips it)
    cast_like_transformers(model, dtype)
    return model


def trace_text_encoder(case: TextEncoderCase, dtype: str, *, fake: bool = True) -> TextEncoderTrace:
    """One call of ``case``'s encoder (or of its submodule ``case.calls``; the weights are the whole model's) on one
    padded prompt (batch 1: the pipelines encode the prompt and the negative
    prompt one after the other; an image encoder on one image), traced on fake tensors (``fake=False``: run for
    real, the check at a tiny size). The attention mask is left out (every token valid): the masks a padded prompt
    adds are tokens x tokens booleans at most, a few MiB beside the hidden states."""
    import torch

    from accelpatch.memory.components import torch_dtype, trace_mode
    from accelpatch.memory.live_bytes import LiveBytes, module_bytes

    with trace_mode(fake):
        model = build_text_encoder(case, torch_dtype(dtype))
        if case.image_size:
            ids = torch.zeros(1, 3, case.image_size, case.image_size, dtype=torch_dtype(dtype))
            inputs = {"pixel_values": ids}
        else:
            ids = torch.zeros(1, case.tokens, dtype=torch.long)
            inputs = {"input_ids": ids}
        want_all = case.output != "last"
        called = model.get_submodule(case.calls) if case.calls else model
        with torch.no_grad(), LiveBytes() as live:
            out = called(**inputs, output_hidden_states=want_all) if want_all else called(**inputs)
            if case.output == "stacked":
                torch.stack(out.hidden_states, dim=-1).flatten(2, 3)
            del out
        weights = module_bytes(model)
        parameters = sum(p.numel() for p in model.parameters())
    return TextEncoderTrace(case.name, weights, live.peak + ids.untyped_storage().nbytes(), parameters, case.tokens,
                            (case.note,) if case.note else ())


def text_encoder_summary(traces) -> str:
    """One line for the table: each encoder's parameters, tokens and weights."""
    from accelpatch.memory.sizes import gib

    return "; ".join(f"{t.name} {t.parameters / 1e9:.2f}B, {t.tokens} tokens, weights {gib(t.weights)}"
                     for t in traces)



def quantised_text_encoders(cases, dtype: str, kind: str = "int8") -> Union[tuple[int, int], str]:
    """(the bytes of every encoder of ``cases`` quantised by torchao's ``kind`` weight-only config on the meta
    device, the largest dequantised temporary among them), or why they cannot be weighed."""
    import torch

    from accelpatch.memory.components import torch_dtype
    from accelpatch.memory.quantised import torchao_quantised

    total, temporary = 0, 0
    for case in cases:
        with torch.device("meta"):
            model = build_text_encoder(case, torch_dtype(dtype))
        weighed = torchao_quantised(model, kind)
        if isinstance(weighed, str):
            return weighed
        total, temporary = total + weighed[0], max(temporary, weighed[1])
    return total, temporary


def trace_text_stage(case: TextStageCase, dtype, videos: int, cfg: int, tokens: int, *,
                     fake: bool = True) -> tuple[int, int, int]:
    """(weights, activations, parameters) of ``case``'s component called once as its pipeline calls it: on the
    hidden states of ``videos`` prompts times CFG's factor ``cfg``, with what the pipeline holds beside them (the
    negative half under CFG) and their mask counted; on fake tensors (``fake=False``: run for real, the check at a
    tiny size)."""
    import torch

    from accelpatch.memory.components import build_component, torch_dtype, trace_mode
    from accelpatch.memory.live_bytes import LiveBytes, module_bytes

    with trace_mode(fake):
        module = build_component(resolve(case.model), case.settings, dtype)
        hidden = torch.zeros(videos * cfg, tokens, case.width, dtype=torch_dtype(dtype))
        mask = torch.ones(videos * cfg, tokens, dtype=torch.long)
        with torch.no_grad(), LiveBytes() as live:
            module(hidden, mask)
        weights = module_bytes(module)
        parameters = sum(p.numel() for p in module.parameters())
    held = hidden.untyped_storage().nbytes() * ((cfg + 1) / cfg if cfg > 1 else 1)
    return weights, live.peak + int(held) + mask.untyped_storage().nbytes(), parameters

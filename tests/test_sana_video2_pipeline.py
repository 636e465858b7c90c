"""SanaVideo2Pipeline: the tiny pipeline end to end, CFG batching, callbacks, the embeddings path, the release's
prompt handling, input validation, defaults, and the save_pretrained/from_pretrained round trip (all offline)."""
import contextlib
import inspect
import json
import math
import string
import subprocess
import sys
from unittest import mock

import numpy as np
import PIL.Image
import pytest
import torch
from _tiny_pipeline_checks import rehome

from accelpatch.models.sana_video2.modeling import SanaVideo2Pipeline
from accelpatch.models.sana_video2.modeling.pipeline_prompts import (RELEASE_CHI_PROMPT, RELEASE_NEGATIVE_PROMPT,
                                                              motion_prompt_suffix)
from accelpatch.testing import sana_video2_pipeline_call_kwargs, tiny_sana_video2_pipeline

CHI = "\n".join(RELEASE_CHI_PROMPT)


@pytest.fixture(scope="module")
def pipe():
    return tiny_sana_video2_pipeline()


def _char_tokenizer():
    """A Gemma tokenizer with one token per character (and BOS), so that token positions are readable."""
    from transformers import GemmaTokenizer

    vocab = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3, "<mask>": 4, "▁": 5}
    for char in string.ascii_letters + string.digits + string.punctuation + "\n":
        vocab.setdefault(char, len(vocab))
    return GemmaTokenizer(vocab=vocab, merges=[], add_bos_token=True)


@pytest.fixture(scope="module")
def char_pipe(pipe):
    """The tiny pipeline with a character-level tokenizer and a text encoder sized to its vocabulary."""
    from transformers import Gemma2Config, Gemma2Model

    tokenizer = _char_tokenizer()
    torch.manual_seed(0)
    text_encoder = Gemma2Model(Gemma2Config(
        head_dim=16, hidden_size=pipe.transformer.config.caption_channels, intermediate_size=64,
        num_attention_heads=2, num_hidden_layers=1, num_key_value_heads=2, vocab_size=len(tokenizer),
        attn_implementation="eager")).eval()
    new = SanaVideo2Pipeline(**{**pipe.components, "tokenizer": tokenizer, "text_encoder": text_encoder})
    new.set_progress_bar_config(disable=True)
    return new


@contextlib.contextmanager
def recording(module, outputs=False):
    """Record the inputs (and outputs) of every forward of ``module``."""
    calls = []

    def pre(_, args, kwargs):
        calls.append({"args": args, **kwargs})

    def post(_, args, kwargs, output):
        calls[-1]["output"] = output

    handles = [module.register_forward_pre_hook(pre, with_kwargs=True)]
    if outputs:
        handles.append(module.register_forward_hook(post, with_kwargs=True))
    try:
        yield calls
    finally:
        for handle in handles:
            handle.remove()


def kwargs(**overrides):
    return {**sana_video2_pipeline_call_kwargs(), **overrides}


# -- end to end ---------------------------------------------------------------------------------------------------

def test_output_types_have_the_right_shapes_and_agree(pipe):
    pt = pipe(**kwargs(output_type="pt")).frames
    assert isinstance(pt, torch.Tensor) and pt.shape == (1, 9, 3, 64, 96) and pt.dtype == torch.float32
    assert 0.0 <= pt.min() and pt.max() <= 1.0 and pt.std() > 0.01
    np_frames = pipe(**kwargs(output_type="np")).frames
    assert isinstance(np_frames, np.ndarray) and np_frames.shape == (1, 9, 64, 96, 3)
    assert np.array_equal(np_frames, pt.permute(0, 1, 3, 4, 2).numpy())
    latent = pipe(**kwargs(output_type="latent")).frames
    assert latent.shape == (1, 8, 2, 2, 3) and latent.dtype == torch.float32  # (9-1)/8+1, 64/32, 96/32
    pil = pipe(**kwargs(output_type="pil")).frames
    assert len(pil) == 1 and len(pil[0]) == 9
    assert all(isinstance(f, PIL.Image.Image) and f.size == (96, 64) for f in pil[0])
    as_tuple = pipe(**kwargs(return_dict=False))
    assert isinstance(as_tuple, tuple) and len(as_tuple) == 1 and torch.equal(as_tuple[0], pt)


def test_same_seed_gives_identical_frames_another_seed_differs(pipe):
    first = pipe(**kwargs(generator=torch.Generator().manual_seed(3))).frames
    again = pipe(**kwargs(generator=torch.Generator().manual_seed(3))).frames
    other = pipe(**kwargs(generator=torch.Generator().manual_seed(4))).frames
    assert torch.equal(first, again)
    assert not torch.equal(first, other)


def test_given_latents_replace_the_noise(pipe):
    latents = torch.randn(1, 8, 2, 2, 3, generator=torch.Generator().manual_seed(5))
    a = pipe(**kwargs(latents=latents, generator=torch.Generator().manual_seed(0))).frames
    b = pipe(**kwargs(latents=latents, generator=torch.Generator().manual_seed(1))).frames
    assert torch.equal(a, b)
    with pytest.raises(ValueError, match=r"`latents` must have shape \(1, 8, 2, 2, 3\)"):
        pipe(**kwargs(latents=torch.zeros(1, 8, 2, 2, 2)))


# -- guidance -----------------------------------------------------------------------------------------------------

def _embeds(pipe, batch=1, length=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    channels = pipe.transformer.config.caption_channels
    mask = torch.ones(batch, length, dtype=torch.long)
    mask[:, length - 2:] = 0
    return torch.randn(batch, length, channels, generator=g), mask


def test_cfg_is_one_batched_transformer_call_of_two_per_step_negative_first(pipe):
    positive, mask = _embeds(pipe, seed=1)
    negative, negative_mask = _embeds(pipe, seed=2)
    negative_mask[:, 3:] = 0
    with recording(pipe.transformer, outputs=True) as calls, \
            mock.patch.object(pipe.scheduler, "step", wraps=pipe.scheduler.step) as step:
        pipe(**kwargs(prompt=None, negative_prompt=None, prompt_embeds=positive, prompt_attention_mask=mask,
                      negative_prompt_embeds=negative, negative_prompt_attention_mask=negative_mask,
                      num_inference_steps=3, guidance_scale=6.5))
    assert len(calls) == 3 and step.call_count == 3
    for call, t, step_call in zip(calls, pipe.scheduler.timesteps, step.call_args_list):
        assert call["args"][0].shape[0] == 2
        assert torch.equal(call["args"][0][0], call["args"][0][1])  # the same latents twice
        assert torch.equal(call["encoder_hidden_states"], torch.cat([negative, positive]))
        assert torch.equal(call["encoder_attention_mask"], torch.cat([negative_mask, mask]))
        assert torch.equal(call["timestep"], t.expand(2))
        # the scheduler gets v_neg + s·(v_pos - v_neg)
        v_neg, v_pos = call["output"][0].float().chunk(2)
        assert torch.equal(step_call.args[0], v_neg + 6.5 * (v_pos - v_neg))
        assert torch.equal(step_call.args[1], t)


def test_guidance_scale_one_runs_the_positive_prompt_alone(pipe):
    positive, mask = _embeds(pipe, seed=1)
    with recording(pipe.transformer) as calls:
        out = pipe(**kwargs(prompt=None, prompt_embeds=positive, prompt_attention_mask=mask, guidance_scale=1.0,
                            num_inference_steps=2, output_type="latent")).frames
    assert [c["args"][0].shape[0] for c in calls] == [1, 1]
    assert all(torch.equal(c["encoder_hidden_states"], positive) for c in calls)
    # with the negative equal to the positive, guidance changes nothing (v_neg + s·(v_pos - v_neg) = v_pos)
    same = pipe(**kwargs(prompt=None, negative_prompt=None, prompt_embeds=positive, prompt_attention_mask=mask,
                         negative_prompt_embeds=positive, negative_prompt_attention_mask=mask, guidance_scale=8.0,
                         num_inference_steps=2, output_type="latent")).frames
    assert torch.allclose(same, out, atol=1e-5, rtol=1e-5)
    different, different_mask = _embeds(pipe, seed=2)
    guided = pipe(**kwargs(prompt=None, negative_prompt=None, prompt_embeds=positive, prompt_attention_mask=mask,
                           negative_prompt_embeds=different, negative_prompt_attention_mask=different_mask,
                           guidance_scale=8.0, num_inference_steps=2, output_type="latent")).frames
    assert not torch.allclose(guided, out, atol=1e-3)


def test_num_videos_per_prompt_repeats_each_prompt(pipe):
    with recording(pipe.transformer) as calls:
        out = pipe(**kwargs(prompt=["one", "two"], num_videos_per_prompt=2, num_inference_steps=1,
                            output_type="latent")).frames
    assert out.shape[0] == 4 and calls[0]["args"][0].shape[0] == 8


# -- callbacks ----------------------------------------------------------------------------------------------------

def test_callback_on_step_end_runs_each_step_and_can_replace_latents(pipe):
    seen = []

    def callback(pipeline, step, timestep, tensors):
        assert pipeline is pipe and set(tensors) == {"latents", "prompt_embeds"}
        assert tensors["prompt_embeds"].shape[0] == 2  # [negative, positive]
        seen.append((step, int(timestep)))
        return {"latents": torch.zeros_like(tensors["latents"])} if step == 2 else {}

    out = pipe(**kwargs(num_inference_steps=3, output_type="latent", callback_on_step_end=callback,
                        callback_on_step_end_tensor_inputs=["latents", "prompt_embeds"])).frames
    assert seen == [(i, int(t)) for i, t in enumerate(pipe.scheduler.timesteps)]
    assert torch.equal(out, torch.zeros_like(out))

    halfway = []

    def zero_after_first(pipeline, step, timestep, tensors):
        halfway.append(step)
        return {"latents": torch.zeros_like(tensors["latents"])} if step == 0 else {}

    changed = pipe(**kwargs(num_inference_steps=2, output_type="latent", callback_on_step_end=zero_after_first))
    untouched = pipe(**kwargs(num_inference_steps=2, output_type="latent"))
    assert halfway == [0, 1] and not torch.equal(changed.frames, untouched.frames)


# -- text ---------------------------------------------------------------------------------------------------------

def test_prompt_embeds_path_matches_the_prompt_path_and_needs_no_text_encoder(pipe):
    reference = pipe(**kwargs(num_inference_steps=2)).frames
    embeds, mask, negative, negative_mask = pipe.encode_prompt(
        "a tiny test video", negative_prompt=RELEASE_NEGATIVE_PROMPT,
        max_sequence_length=pipe.transformer.config.model_max_length)
    assert embeds.shape == (1, 8, 32) and mask.shape == (1, 8) and negative.shape == (1, 8, 32)
    bare = SanaVideo2Pipeline(**{**pipe.components, "tokenizer": None, "text_encoder": None})
    bare.set_progress_bar_config(disable=True)
    out = bare(**kwargs(prompt=None, prompt_embeds=embeds, prompt_attention_mask=mask,
                        negative_prompt_embeds=negative, negative_prompt_attention_mask=negative_mask,
                        num_inference_steps=2)).frames
    assert torch.equal(out, reference)
    with pytest.raises(ValueError, match="needs `negative_prompt_embeds`"):
        bare(**kwargs(prompt=None, prompt_embeds=embeds, prompt_attention_mask=mask))
    with pytest.raises(ValueError, match="tokenizer and text_encoder"):
        bare(**kwargs())
    assert bare(**kwargs(prompt=None, prompt_embeds=embeds, prompt_attention_mask=mask, guidance_scale=1.0,
                         num_inference_steps=1)).frames.shape == (1, 9, 3, 64, 96)
    # with a text encoder, the negative prompt is encoded to the length of the given prompt_embeds
    short, short_mask = embeds[:, :5], mask[:, :5]
    with recording(pipe.transformer) as calls:
        pipe(**kwargs(prompt=None, prompt_embeds=short, prompt_attention_mask=short_mask, num_inference_steps=1))
    assert calls[0]["encoder_hidden_states"].shape == (2, 5, 32)
    assert torch.equal(calls[0]["encoder_hidden_states"][1], short[0])
    with pytest.raises(ValueError, match="max_sequence_length=8 tokens but `prompt_embeds` has 5"):
        pipe(**kwargs(prompt=None, prompt_embeds=short, prompt_attention_mask=short_mask, max_sequence_length=8))


def _encode_and_record(pipe, **call):
    """Run one denoising step; return the text encoder's calls (inputs and outputs) and the transformer's call."""
    with recording(pipe.text_encoder, outputs=True) as text_calls, recording(pipe.transformer) as model_calls:
        pipe(**kwargs(num_inference_steps=1, output_type="latent", **call))
    return text_calls, model_calls[0]


def test_positive_prompt_gets_the_instruction_and_motion_score_and_the_transformer_sees_the_prompt(char_pipe):
    tok = char_pipe.tokenizer
    length = 64
    text_calls, model_call = _encode_and_record(char_pipe, prompt="  A red fox runs.  ", max_sequence_length=length)
    positive, negative = text_calls  # the positive prompt is encoded first
    ids, mask = positive["args"][0][0], positive["attention_mask"][0]
    expected_text = CHI + "A red fox runs. motion score: 20."
    assert tok.decode(ids[mask.bool()], skip_special_tokens=True) == expected_text
    assert ids[0] == tok.bos_token_id
    # the release's window: len(encode(instruction)) + L - 2 tokens
    assert ids.shape[0] == len(tok.encode(CHI)) + length - 2
    # the transformer gets BOS and the last L - 1 positions: the instruction's trailing space, the prompt, padding
    keep = [0] + list(range(-length + 1, 0))
    kept = ids[keep][mask[keep].bool()]
    assert tok.decode(kept, skip_special_tokens=True) == " A red fox runs. motion score: 20."
    hidden = positive["output"][0]
    assert torch.equal(model_call["encoder_hidden_states"][1], hidden[0, keep])
    assert torch.equal(model_call["encoder_attention_mask"][1], mask[keep])
    # the negative prompt: the release's default, no instruction, no motion score, L tokens
    neg_ids, neg_mask = negative["args"][0][0], negative["attention_mask"][0]
    assert neg_ids.shape[0] == length and bool(neg_mask.all())
    assert tok.decode(neg_ids, skip_special_tokens=True) == RELEASE_NEGATIVE_PROMPT[:length - 1]
    assert torch.equal(model_call["encoder_hidden_states"][0], negative["output"][0][0])


def test_long_prompts_are_cut_at_the_end_as_in_the_release(char_pipe):
    tok = char_pipe.tokenizer
    text_calls, model_call = _encode_and_record(char_pipe, prompt="A red fox runs. motion score: 20.",
                                                max_sequence_length=16)
    ids = text_calls[0]["args"][0][0]
    keep = [0] + list(range(-15, 0))
    assert tok.decode(ids[keep], skip_special_tokens=True) == " A red fox runs"  # BOS, " ", 14 prompt characters
    assert model_call["encoder_hidden_states"].shape == (2, 16, 32)


def test_motion_score_and_instruction_options(char_pipe):
    tok = char_pipe.tokenizer

    def positive_text(**call):
        text_calls, _ = _encode_and_record(char_pipe, prompt="a cat", max_sequence_length=24, **call)
        ids, mask = text_calls[0]["args"][0][0], text_calls[0]["attention_mask"][0]
        return tok.decode(ids[mask.bool()], skip_special_tokens=True), ids.shape[0]

    assert positive_text(motion_score=7) == (CHI + "a cat motion score: 7.", len(tok.encode(CHI)) + 22)
    assert positive_text(motion_score=None)[0] == CHI + "a cat"
    assert positive_text(motion_score=0)[0] == CHI + "a cat low motion"
    assert positive_text(motion_score=0, high_motion=True)[0] == CHI + "a cat high motion"
    assert positive_text(complex_human_instruction=[]) == ("a cat motion score: 20.", 24)
    # L + len(encode(instruction)) - 2 tokens leave the prompt L - 2 tokens here (the release counts on the
    # instruction's trailing space merging into the prompt's first token, which a character vocabulary never does)
    assert positive_text(complex_human_instruction=["Say:", ""])[0] == "Say:\na cat motion score: 20"
    assert motion_prompt_suffix(20) == " motion score: 20." and motion_prompt_suffix(12.7) == " motion score: 12."
    assert SanaVideo2Pipeline.assemble_prompts([" x ", "y"], motion_score=None, complex_human_instruction=None) \
        == ["x", "y"]


def test_negative_prompt_options(char_pipe):
    tok = char_pipe.tokenizer

    def negative_text(**call):
        text_calls, _ = _encode_and_record(char_pipe, prompt="a cat", max_sequence_length=24, **call)
        ids, mask = text_calls[1]["args"][0][0], text_calls[1]["attention_mask"][0]
        return tok.decode(ids[mask.bool()], skip_special_tokens=True)

    assert negative_text(negative_prompt="") == ""
    assert negative_text(negative_prompt=" blurry ") == " blurry "  # the release does not strip it
    text_calls, _ = _encode_and_record(char_pipe, prompt="a cat", guidance_scale=1.0)
    assert len(text_calls) == 1  # no guidance, no negative prompt


# -- validation ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("overrides, message", [
    (dict(height=48), r"`height` must be a positive multiple of the VAE's spatial compression 32, got 48"),
    (dict(width=0), r"`width` must be a positive multiple of the VAE's spatial compression 32, got 0"),
    (dict(height=64.0), r"`height` must be a positive multiple"),
    (dict(frames=10), r"`frames` must be of the form 8k\+1 \(1, 9, 17, ...\) .* got 10"),
    (dict(frames=0), r"`frames` must be of the form 8k\+1"),
    (dict(num_inference_steps=0), r"`num_inference_steps` must be an int >= 1, got 0"),
    (dict(num_videos_per_prompt=0), r"`num_videos_per_prompt` must be an int >= 1"),
    (dict(max_sequence_length=0), r"`max_sequence_length` must be an int >= 1"),
    (dict(guidance_scale=float("nan")), r"`guidance_scale` must be a finite number"),
    (dict(output_type="mp4"), r"`output_type` must be one of 'pil', 'np', 'pt', 'latent', got 'mp4'"),
    (dict(motion_score="high"), r"motion_score must be an int or None, got 'high'"),
    (dict(prompt=None), r"pass `prompt` \(a string or a list of strings\) or `prompt_embeds`"),
    (dict(prompt=3), r"`prompt` must be a string or a non-empty list of strings"),
    (dict(prompt=[]), r"`prompt` must be a string or a non-empty list of strings"),
    (dict(prompt=["a", "b"], negative_prompt=["n"]), r"`negative_prompt` has 1 entries for 2 prompts"),
    (dict(callback_on_step_end_tensor_inputs=["noise"]), r"got unknown \['noise'\]"),
    (dict(generator=[torch.Generator(), torch.Generator()]), r"list of 2 generators for an effective batch of 1"),
])
def test_bad_inputs_raise_clear_errors(pipe, overrides, message):
    with pytest.raises(ValueError, match=message):
        pipe(**kwargs(**overrides))


def test_bad_embeddings_raise_clear_errors(pipe):
    embeds, mask = _embeds(pipe)
    base = dict(prompt=None, negative_prompt=None)
    cases = [
        (dict(prompt="x", prompt_embeds=embeds, prompt_attention_mask=mask), "either `prompt` or `prompt_embeds`"),
        (dict(prompt_embeds=embeds), "`prompt_attention_mask` is required with `prompt_embeds`"),
        (dict(prompt_embeds=embeds[..., :16], prompt_attention_mask=mask),
         r"must be \[batch, tokens, 32\] \(the transformer's caption_channels\), got \(1, 8, 16\)"),
        (dict(prompt_embeds=embeds, prompt_attention_mask=mask[:, :4]), r"must be \[batch, tokens\] = \(1, 8\)"),
        (dict(prompt_embeds=embeds, prompt_attention_mask=mask, negative_prompt_embeds=embeds[:, :4],
              negative_prompt_attention_mask=mask[:, :4]), "must have the same shape"),
        (dict(prompt="x", negative_prompt_embeds=embeds, negative_prompt_attention_mask=mask),
         "`negative_prompt_embeds` goes with `prompt_embeds`"),
        (dict(prompt_embeds=embeds, prompt_attention_mask=mask, negative_prompt="n", negative_prompt_embeds=embeds,
              negative_prompt_attention_mask=mask), "either `negative_prompt` or `negative_prompt_embeds`"),
    ]
    for overrides, message in cases:
        with pytest.raises(ValueError, match=message):
            pipe(**kwargs(**{**base, **overrides}))


# -- defaults -----------------------------------------------------------------------------------------------------

def test_call_defaults_are_the_release_settings(pipe):
    defaults = {k: p.default for k, p in inspect.signature(SanaVideo2Pipeline.__call__).parameters.items()}
    assert (defaults["height"], defaults["width"], defaults["frames"]) == (736, 1280, 193)
    assert (defaults["num_inference_steps"], defaults["guidance_scale"], defaults["motion_score"]) == (50, 8.0, 20)
    assert defaults["complex_human_instruction"] == RELEASE_CHI_PROMPT and len(RELEASE_CHI_PROMPT) == 8
    assert RELEASE_CHI_PROMPT[-1] == "User Prompt: " and RELEASE_NEGATIVE_PROMPT.startswith("A chaotic sequence")
    assert SanaVideo2Pipeline.fps == 24
    assert (pipe.vae_scale_factor_temporal, pipe.vae_scale_factor_spatial) == (8, 32)


@pytest.mark.parametrize("steps", [2, 50])
def test_scheduler_runs_the_release_flow_grid(steps):
    scheduler = SanaVideo2Pipeline.release_scheduler()
    assert scheduler.config.flow_shift == 12.0 and scheduler.config.prediction_type == "flow_prediction"
    scheduler.set_timesteps(steps)
    # release time_uniform_flow grid: s_k = 1 - linspace(1, 1/1000, N+1), shifted by shift·s / (1 + (shift-1)·s)
    shift = 12.0
    expected = []
    for k in range(steps, 0, -1):
        s = 1.0 - (1.0 + (1 / 1000 - 1.0) * k / steps)
        expected.append(shift * s / (1 + (shift - 1) * s))
    assert np.allclose(scheduler.sigmas[:-1].double().numpy(), expected, rtol=1e-6)
    assert float(scheduler.sigmas[-1]) == 0.0
    assert [int(t) for t in scheduler.timesteps] == [int(math.floor(s * 1000)) for s in expected]


# -- save / load --------------------------------------------------------------------------------------------------
#
# from_pretrained leaves every tensor inside the safetensors file's memory map, at offsets that are only 8-byte
# aligned; CPU kernels round differently on such operands at some shapes (same weights, ~1e-6 apart). So the round
# trip is checked as: every weight and config bit-identical as loaded, and the frames bit-identical once the loaded
# tensors are moved to freshly allocated memory (what any .to(device) or dtype cast does anyway).



def _assert_same_components(loaded, original):
    assert set(loaded.components) == set(original.components)
    for name, component in original.components.items():
        other = loaded.components[name]
        assert type(other) is type(component), name
        if isinstance(component, torch.nn.Module):
            mine, theirs = component.state_dict(), other.state_dict()
            assert mine.keys() == theirs.keys(), name
            assert all(torch.equal(mine[k], theirs[k]) and mine[k].dtype == theirs[k].dtype for k in mine), name
            assert not other.training, name
        if hasattr(component, "config"):
            assert _config(other) == _config(component), name


def _config(component):
    config = component.config
    config = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    config = {k: v for k, v in config.items() if not k.startswith("_") and k not in ("transformers_version", "dtype")}
    return json.loads(json.dumps(config, default=str))  # tuples and lists alike


def test_save_pretrained_from_pretrained_round_trip_offline(pipe, tmp_path):
    import diffusers

    reference = pipe(**kwargs()).frames
    unguided = pipe(**kwargs(guidance_scale=1.0)).frames
    pipe.save_pretrained(tmp_path)
    index = json.loads((tmp_path / "model_index.json").read_text())
    assert index["_class_name"] == "SanaVideo2Pipeline"
    assert index["transformer"] == ["accelpatch.models.sana_video2.modeling.transformer", "SanaVideo2Transformer3DModel"]
    assert index["vae"] == ["diffusers", "AutoencoderKLLTX2Video"]
    for loader in (SanaVideo2Pipeline, diffusers.DiffusionPipeline):
        loaded = loader.from_pretrained(tmp_path)
        assert type(loaded) is SanaVideo2Pipeline
        _assert_same_components(loaded, pipe)
        assert loaded.tokenizer.get_vocab() == pipe.tokenizer.get_vocab()
        loaded.set_progress_bar_config(disable=True)
        assert torch.allclose(loaded(**kwargs()).frames, reference, atol=1e-5, rtol=0)
        rehome(loaded)
        assert torch.equal(loaded(**kwargs()).frames, reference)
        assert torch.equal(loaded(**kwargs(guidance_scale=1.0)).frames, unguided)


@pytest.mark.parametrize("documented_import", [
    "import accelpatch.models.sana_video2.modeling",
    "import accelpatch; accelpatch.models.sana_video2.modeling.SanaVideo2Transformer3DModel",
])
def test_diffusion_pipeline_loads_a_saved_folder_after_the_documented_import(pipe, tmp_path, documented_import):
    """In a fresh process: the import docs/models/sana-video2.md names, then diffusers' generic loader and nothing
    else."""
    pipe.save_pretrained(tmp_path)
    code = (f"{documented_import}\nimport diffusers\n"
            "print('pipeline imported:', 'accelpatch.models.sana_video2.modeling.pipeline' in sys.modules)\n"
            "loaded = diffusers.DiffusionPipeline.from_pretrained(sys.argv[1])\n"
            "print(type(loaded).__module__, type(loaded).__name__, type(loaded.transformer).__name__)\n"
            "print(diffusers.AutoencoderKLLTX2Video.__name__, hasattr(diffusers, 'NoSuchPipeline'))\n")
    result = subprocess.run([sys.executable, "-c", "import sys\n" + code, str(tmp_path)], capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.splitlines() == [
        "pipeline imported: False",  # the import stays light: the pipeline loads when diffusers asks for it
        "accelpatch.models.sana_video2.modeling.pipeline SanaVideo2Pipeline SanaVideo2Transformer3DModel",
        "AutoencoderKLLTX2Video False"]  # diffusers' own lazy names still resolve


def test_embeddings_only_pipeline_round_trips(pipe, tmp_path):
    bare = SanaVideo2Pipeline(**{**pipe.components, "tokenizer": None, "text_encoder": None})
    bare.save_pretrained(tmp_path)
    loaded = rehome(SanaVideo2Pipeline.from_pretrained(tmp_path))
    assert loaded.tokenizer is None and loaded.text_encoder is None
    _assert_same_components(loaded, bare)
    embeds, mask = _embeds(pipe)
    call = lambda: kwargs(prompt=None, prompt_embeds=embeds, prompt_attention_mask=mask, guidance_scale=1.0)  # noqa
    loaded.set_progress_bar_config(disable=True)
    bare.set_progress_bar_config(disable=True)
    assert torch.equal(loaded(**call()).frames, bare(**call()).frames)

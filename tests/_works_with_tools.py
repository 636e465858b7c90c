"""Helpers of ``test_works_with.py``: the tiny bf16 models, the tools people put on big video models (each a
:class:`Tool`, applied in place to a transformer or a pipeline), the checks every combination must pass
(bit-identical outputs, a ``remove()`` back to the same bits, unchanged weights: SHA-256 of the plain tensors behind
every state-dict entry), and the unpatched probe that runs each combination without accelpatch in a subprocess
first, so that a tool that crashes by itself on this CPU is a named skip, not a dead test worker."""
from __future__ import annotations

import functools
import gc
import hashlib
import importlib.metadata
import json
import os
import re
import signal
import subprocess
import sys
import warnings
import weakref
from pathlib import Path
from typing import Callable, Optional

import pytest
import torch

import accelpatch
from accelpatch import testing as T

#: family -> a pipeline call's arguments, small (a tiny bf16 pipeline: ``tiny_<family>_pipeline``)
PIPELINE_CALLS = {
    "sana_video": T.sana_video_pipeline_call_kwargs,
    "wan": lambda: T.wan_pipeline_call_kwargs(num_inference_steps=4, height=32, width=32, num_frames=5),
}


def build_pipeline(family: str):
    return getattr(T, f"tiny_{family}_pipeline")(dtype=torch.bfloat16)


def frames(pipe, family: str) -> torch.Tensor:
    return pipe(**PIPELINE_CALLS[family]()).frames


#: family -> (builder, inputs builder)
FAMILIES = {
    "sana_video": (T.tiny_sana_video_transformer, T.sana_video_transformer_inputs),
    "wan": (T.tiny_wan_transformer, functools.partial(T.wan_transformer_inputs, num_frames=2, height=8, width=8)),
    "sana_video2": (T.tiny_sana_video2_transformer, T.sana_video2_transformer_inputs),
    "minimax_h3": (T.tiny_minimax_h3_transformer, T.minimax_h3_transformer_inputs),
}
_INPUTS: dict[str, dict] = {}


def build(family: str, config=None) -> torch.nn.Module:
    """The family's tiny transformer in bf16 (same seed: same weights every time)."""
    builder = FAMILIES[family][0]
    return builder(config, dtype=torch.bfloat16) if config is not None else builder(dtype=torch.bfloat16)


def inputs(family: str) -> dict:
    """One bf16 input per family, built once."""
    if family not in _INPUTS:
        _INPUTS[family] = FAMILIES[family][1](build(family))
    return _INPUTS[family]


def forward(model: torch.nn.Module, family_or_inputs) -> torch.Tensor:
    kwargs = inputs(family_or_inputs) if isinstance(family_or_inputs, str) else family_or_inputs
    with torch.no_grad():
        return model(**kwargs).sample


#: transformer -> diffusers' block-registry entries accelpatch held just before the test applied it
_HELD_BEFORE: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def held_entries(collect: bool = False) -> dict[type, int]:
    """How many patched models hold each class accelpatch registered in diffusers' block registry (other tests'
    models that are still alive, such as one a failed test's traceback keeps, hold theirs); ``collect`` first lets
    the garbage collector release what unreachable models hold."""
    from accelpatch.core import block_registry

    if collect:
        gc.collect()
    with block_registry._LOCK:
        return {cls: held[1] for cls, held in block_registry._HELD.items()}


def _within(now: dict, before: dict) -> bool:
    """Nothing held now that was not held before (what other models held since may only have gone)."""
    return all(n <= before.get(cls, 0) for cls, n in now.items())


def apply(target, **kwargs):
    """``accelpatch.apply`` without the CPU box's expected "not mounted: CUDA is unavailable" warnings; remembers
    the registry entries held before, for :func:`assert_unpatched`."""
    from accelpatch.core.patcher import transformers_of

    for model in transformers_of(target):
        _HELD_BEFORE.setdefault(model, held_entries())
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*(not mounted|CUDA).*", category=RuntimeWarning)
        return accelpatch.apply(target, **kwargs)


def need(module: str):
    """The optional package ``module`` (a guard: the tests of a tool skip where it is not installed)."""
    return pytest.importorskip(module)


# -- weights -----------------------------------------------------------------------------------------------------

def _plain_parts(tensor: torch.Tensor, name: str = ""):
    """The plain tensors behind ``tensor``: itself, or a tensor subclass's inner tensors (torchao's
    ``__tensor_flatten__``), or a subclass's own storage viewed as a plain tensor (GGUF's ``GGUFParameter``)."""
    if type(tensor) not in (torch.Tensor, torch.nn.Parameter) and hasattr(tensor, "__tensor_flatten__"):
        names, _ = tensor.__tensor_flatten__()
        for inner in names:
            yield from _plain_parts(getattr(tensor, inner), f"{name}.{inner}")
        return
    with torch._C.DisableTorchFunctionSubclass():
        yield name, tensor.detach().cpu().contiguous().reshape(-1)


def sha256(tensor: torch.Tensor) -> str:
    digest = hashlib.sha256()
    for name, part in _plain_parts(tensor):
        digest.update(f"{name}|{part.dtype}|{part.numel()}|".encode())
        with torch._C.DisableTorchFunctionSubclass():
            digest.update(part.view(torch.uint8).numpy().tobytes())
    return f"{tuple(tensor.shape)} {tensor.dtype} {digest.hexdigest()}"


def weights(model: torch.nn.Module) -> dict[str, str]:
    """SHA-256 of every state-dict entry (the plain tensors behind it), by key."""
    return {key: sha256(value) for key, value in model.state_dict().items()}


def saved_files(model: torch.nn.Module, folder, **kwargs) -> dict[str, str]:
    """``save_pretrained`` into ``folder``: SHA-256 of each file written, by name."""
    model.save_pretrained(folder, **kwargs)
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def assert_unpatched(model: torch.nn.Module, like: Optional[torch.nn.Module] = None) -> None:
    """No module keeps a gated class, and diffusers' block registry holds what it held before the test applied
    ``model`` (or ``like``, the model it was copied from): ``remove()`` let go of what the patch registered (a
    patched model dropped without ``remove()`` lets go of its entries when it is collected), whatever other live
    models hold. No entry of a gated class is left that no patched model holds."""
    from diffusers.hooks._helpers import TransformerBlockRegistry

    from accelpatch.core import block_registry

    assert not [m for m in model.modules() if "_accelpatch_original_class" in type(m).__dict__]
    before = _HELD_BEFORE[like if like is not None else model]
    now = held_entries()
    if not _within(now, before):  # unreachable models of earlier tests may have been holding entries: collect
        now = held_entries(collect=True)
    assert _within(now, before), (now, before)
    orphans = [c for c in TransformerBlockRegistry._registry
               if "_accelpatch_original_class" in c.__dict__ and c not in block_registry._HELD]
    assert not orphans, orphans


# -- the tools -------------------------------------------------------------------------------------------------------

class Tool:
    """A tool people put on a model, applied in place by calling it on the transformer (or pipeline); built from a
    name and arguments, so that another process can build the same one (:func:`skip_unless_unpatched_runs`)."""

    def __init__(self, name: str, *args) -> None:
        self.name, self.args = name, args
        self._apply = _TOOLS[name](*args)

    def __call__(self, target) -> None:
        self._apply(target)

    @property
    def key(self) -> tuple:
        return (self.name, *self.args)

    def __repr__(self) -> str:
        return f"Tool{self.key!r}"


def _torchao(config_name: str):
    def tool(model):
        quantization = need("torchao.quantization")
        quantization.quantize_(model, getattr(quantization, config_name)())
    return tool


def _quanto_int8(model) -> None:
    quanto = need("optimum.quanto")
    quanto.quantize(model, weights=quanto.qint8)
    quanto.freeze(model)


def _layerwise_casting(model) -> None:
    model.enable_layerwise_casting(storage_dtype=torch.float8_e4m3fn, compute_dtype=torch.bfloat16)


def _group_offload(offload_type: str):
    def tool(model):
        from diffusers.hooks import apply_group_offloading

        cpu = torch.device("cpu")
        extra = {"num_blocks_per_group": 1} if offload_type == "block_level" else {}
        apply_group_offloading(model, onload_device=cpu, offload_device=cpu, offload_type=offload_type, **extra)
    return tool


def _enable_group_offload(model) -> None:
    cpu = torch.device("cpu")
    model.enable_group_offload(onload_device=cpu, offload_device=cpu, offload_type="block_level",
                               num_blocks_per_group=1)


def _lora_adapter(*targets: str):
    """PEFT's LoRA on ``targets`` (seeded, not initialised to zero)."""
    def tool(model):
        peft = need("peft")
        torch.manual_seed(3)
        model.add_adapter(peft.LoraConfig(r=4, lora_alpha=4, target_modules=list(targets), init_lora_weights=False))
    return tool


def _attention_backend(name: str):
    return lambda model: model.set_attention_backend(name)


def diffusers_cache_config(kind: str, steps: int = 4):
    """diffusers' own step cache config: ``first_block`` or ``mag``."""
    from diffusers import FirstBlockCacheConfig, MagCacheConfig

    if kind == "first_block":
        return FirstBlockCacheConfig(threshold=0.5)
    return MagCacheConfig(mag_ratios=[1.0] * steps, num_inference_steps=steps, threshold=0.5)


def _diffusers_cache(kind: str):
    return lambda pipe: pipe.transformer.enable_cache(diffusers_cache_config(kind))


def cache_dit_config():
    cache_dit = need("cache_dit")
    return cache_dit.DBCacheConfig(Fn_compute_blocks=1, Bn_compute_blocks=0, max_warmup_steps=1,
                                   residual_diff_threshold=0.5)


def _cache_dit(pipe) -> None:
    need("cache_dit").enable_cache(pipe, cache_config=cache_dit_config())


def _model_cpu_offload(pipe) -> None:
    pipe.enable_model_cpu_offload(device="cpu")



def _gguf_q8_0(model) -> None:
    """Q8_0-quantize every Linear whose rows split into 32-value blocks, with the ``gguf`` package, and load the
    result as diffusers' GGUF loader does (``GGUFLinear`` layers holding ``GGUFParameter`` weights), through
    diffusers' own helper: for families diffusers cannot single-file-load (SANA-Video has no single-file mapping)."""
    gguf = need("gguf")
    from diffusers.quantizers.gguf.utils import GGUFParameter, _replace_with_gguf_linear

    state = {}
    for key, value in model.state_dict().items():
        if key.endswith(".weight") and value.ndim == 2 and value.shape[1] % 32 == 0:
            packed = gguf.quantize(value.float().numpy(), gguf.GGMLQuantizationType.Q8_0)
            state[key] = GGUFParameter(torch.from_numpy(packed), quant_type=gguf.GGMLQuantizationType.Q8_0)
        else:
            state[key] = value
    _replace_with_gguf_linear(model, torch.bfloat16, state)  # new layers, on the meta device
    for key, value in state.items():
        owner, _, name = key.rpartition(".")
        module = model.get_submodule(owner)
        if isinstance(value, GGUFParameter) or module._parameters.get(name) is not None and module._parameters[
                name].is_meta:
            module._parameters[name] = value if isinstance(value, GGUFParameter) else torch.nn.Parameter(
                value, requires_grad=False)


def write_gguf_checkpoint(model: torch.nn.Module, path) -> None:
    """``model``'s state dict as a GGUF file: Q8_0 for Linear weights whose rows split into 32-value blocks, float32
    for the rest (diffusers-format keys, which ``from_single_file`` loads without conversion)."""
    gguf = need("gguf")
    writer = gguf.GGUFWriter(str(path), "accelpatch-test")
    for key, value in model.state_dict().items():
        array = value.float().numpy()
        if key.endswith(".weight") and value.ndim == 2 and value.shape[1] % 32 == 0:
            packed = gguf.quantize(array, gguf.GGMLQuantizationType.Q8_0)
            writer.add_tensor(key, packed, raw_shape=packed.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            writer.add_tensor(key, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


_TOOLS: dict[str, Callable] = {
    "torchao": _torchao,
    "quanto_int8": lambda: _quanto_int8,
    "gguf_q8_0": lambda: _gguf_q8_0,
    "layerwise_casting": lambda: _layerwise_casting,
    "group_offload": _group_offload,
    "enable_group_offload": lambda: _enable_group_offload,
    "lora_adapter": _lora_adapter,
    "attention_backend": _attention_backend,
    # pipeline tools: called on a pipeline
    "diffusers_cache": _diffusers_cache,
    "cache_dit": lambda: _cache_dit,
    "model_cpu_offload": lambda: _model_cpu_offload,
}

#: the tools as tests use them
torchao = functools.partial(Tool, "torchao")
quanto_int8 = Tool("quanto_int8")
gguf_q8_0 = Tool("gguf_q8_0")
layerwise_casting = Tool("layerwise_casting")
group_offload = functools.partial(Tool, "group_offload")
enable_group_offload = Tool("enable_group_offload")
lora_adapter = functools.partial(Tool, "lora_adapter")
attention_backend = functools.partial(Tool, "attention_backend")
diffusers_cache = functools.partial(Tool, "diffusers_cache")
cache_dit = Tool("cache_dit")
model_cpu_offload = Tool("model_cpu_offload")


# -- the unpatched tool first, in a process of its own ---------------------------------------------------------------
# Tools that run native code (optimum-quanto's int8 matmul through torch._weight_int8pack_mm, torchao, gguf, ...)
# can crash the interpreter on some CPUs by themselves. Each combination runs once unpatched in a subprocess first: one
# that crashes, hangs or raises there is skipped with the reason instead of taking the test worker down; a crash with
# accelpatch applied where the unpatched run did not crash stays a failure.

PROBE_SCRIPT = Path(__file__).with_name("_works_with_probe.py")
#: seconds a probe process may take: start-up (imports) plus this much per combination
PROBE_START_S, PROBE_EACH_S = 120, 60
#: tool -> the distribution that ships it, named in a skip reason
DISTRIBUTIONS = {"torchao": "torchao", "quanto_int8": "optimum-quanto", "gguf_q8_0": "gguf", "lora_adapter": "peft",
                 "cache_dit": "cache-dit"}
#: probe key -> None (ran unpatched) or why the combination cannot run here even unpatched
_UNPATCHED: dict[str, Optional[str]] = {}


def probe_key(target: str, tool: Tool, config: Optional[dict] = None) -> str:
    """One combination: ``tool`` on ``target`` (a family's tiny bf16 transformer with ``config``, or
    ``"<family>_pipeline"``, its tiny bf16 pipeline), as a JSON text another process reads."""
    return json.dumps({"target": target, "config": config, "tool": list(tool.key)}, sort_keys=True)


def run_unpatched(key: str) -> None:
    """Run one combination without accelpatch (in the probe process), leaving diffusers' global attention backend
    as it found it (``attention_backend`` sets it for the process)."""
    from diffusers.models.attention_dispatch import _AttentionBackendRegistry

    spec = json.loads(key)
    target, tool = spec["target"], Tool(*spec["tool"])
    backend = _AttentionBackendRegistry._active_backend
    try:
        if target.endswith("_pipeline"):
            family = target[:-len("_pipeline")]
            pipe = build_pipeline(family)
            tool(pipe)
            frames(pipe, family)
        else:
            model = build(target, spec["config"])
            tool(model)
            forward(model, target)
    finally:
        _AttentionBackendRegistry._active_backend = backend


def _tool_name(key: str) -> str:
    name = json.loads(key)["tool"][0]
    dist = DISTRIBUTIONS.get(name, "diffusers" if name != "lora_adapter" else "peft")
    try:
        return f"{dist} {importlib.metadata.version(dist)}"
    except importlib.metadata.PackageNotFoundError:
        return dist


def _innermost_frame(stderr: str) -> Optional[tuple[str, str, str]]:
    """(file, line, function) of the faulting thread's innermost frame in faulthandler's report, if any."""
    lines = stderr.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("Current thread")), None)
    frame = re.match(r'\s*File "(.+)", line (\d+) in (\S+)', lines[start + 1]) if (
        start is not None and start + 1 < len(lines)) else None
    return frame.groups() if frame else None


def _where(stderr: str) -> str:
    """' in FUNC (path/file.py:LINE)' for the faulting frame, or ''."""
    frame = _innermost_frame(stderr)
    if frame is None:
        return ""
    path, line, function = frame
    return f" in {function} ({path.split('site-packages/')[-1]}:{line})"


def _in_accelpatch(stderr: str) -> bool:
    frame = _innermost_frame(stderr)
    return frame is not None and Path(frame[0]).resolve().is_relative_to(Path(accelpatch.__file__).parent)


def _death(returncode: Optional[int], stderr: str, timeout_s: float) -> tuple[str, str]:
    """(what the tool does, the detail) for a probe process that ended inside a combination."""
    if returncode is None:
        return "hangs", f"no answer within {timeout_s:.0f} s"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return "crashes", f"{name}{_where(stderr)}"
    return "ends the process", f"exit status {returncode}{_where(stderr)}"


def probe_unpatched(keys) -> None:
    """Run every combination of ``keys`` not yet known unpatched, in as few subprocesses as crashes allow: a
    process reports each combination as it goes, so a crash names the one it died in and the next process goes on
    after it."""
    from _cpu_kind import describe as describe_cpu

    todo = [key for key in dict.fromkeys(keys) if key not in _UNPATCHED]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.setdefault("OMP_NUM_THREADS", "1")
    while todo:
        returncode: Optional[int]
        timeout_s = PROBE_START_S + PROBE_EACH_S * len(todo)
        try:
            done = subprocess.run([sys.executable, "-X", "faulthandler", str(PROBE_SCRIPT)], input="\n".join(todo),
                                  capture_output=True, text=True, env=env, timeout=timeout_s)
            stdout, stderr, returncode = done.stdout, done.stderr, done.returncode
        except subprocess.TimeoutExpired as expired:
            stdout, stderr, returncode = (_text(expired.stdout), _text(expired.stderr), None)
        current = None
        for line in stdout.splitlines():
            verb, _, rest = line.partition(" ")
            if verb == "start":
                current = todo[int(rest)]
            elif verb in ("ok", "ours") and current is not None:  # ours: the test runs, and fails, by itself
                _UNPATCHED[current], current = None, None
            elif verb == "skipped" and current is not None:
                _UNPATCHED[current], current = json.loads(rest), None
            elif verb == "raised" and current is not None:
                _UNPATCHED[current] = f"{_tool_name(current)} raises unpatched on this CPU: {json.loads(rest)}"
                current = None
        if current is not None and _in_accelpatch(stderr):  # it died in accelpatch's own code: not a skip
            _UNPATCHED[current], current = None, None
        if current is not None:  # the process died (or hung) inside this combination
            does, detail = _death(returncode, stderr, timeout_s)
            _UNPATCHED[current] = f"{_tool_name(current)} {does} unpatched on this CPU ({describe_cpu()}): {detail}"
        elif returncode != 0 and not any(k in _UNPATCHED for k in todo):
            raise RuntimeError(f"the works-with probe process failed before its first combination "
                               f"(exit status {returncode}):\n{stderr[-3000:]}")
        todo = [key for key in todo if key not in _UNPATCHED]


def _text(output) -> str:
    return output.decode(errors="replace") if isinstance(output, bytes) else (output or "")


def skip_unless_unpatched_runs(key: str) -> None:
    """Skip, naming the tool and the reason, where the combination crashes, hangs or raises without accelpatch."""
    probe_unpatched([key])
    reason = _UNPATCHED[key]
    if reason is not None:
        pytest.skip(reason)

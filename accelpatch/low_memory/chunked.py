"""Row-wise computations run in chunks of tokens (``apply(pipe, memory="low")``, issue #44 part 3).

A feed-forward, a query/key norm, a block's AdaLN norm or gated residual, a q/k/v projection with its RoPE compute
each token's row from that row alone, so run on a slice of the tokens they give that slice of their result. Run chunk
by chunk into one output tensor, they hold their intermediates (the feed-forward's hidden state, four times the
model's width; a float32 norm's float32 copies) for one chunk at a time instead of for every token: the peak of a
step falls to what the attention holds. Two ways in, one op: a site-table row (:func:`chunked_rule`) runs a whole
module in chunks; a restated forward calls :func:`chunk_rows` for its row-wise parts.

Whether the chunks give the whole call's result bit for bit depends on the kernels (a GEMM may pick another
algorithm or split for fewer rows). At the default tier the chunked run is a verified op like the fused kernels
(:class:`ChunkedOp`, a :class:`~accelpatch.lossless.verify.ComposedOp`): the first call of each signature (the
input's dtype, shape and strides; the module's structure and its parameters' types, dtypes, shapes and strides; the
chunk; the device and threads) runs it whole and hashes the result (the first sight of every out-of-place verified
op), frees it, then runs the chunks into one output and compares the two bit for bit. A match runs the chunks from
then on; a mismatch runs whole for good, warned once (``strict=True`` raises). That first call holds the whole
computation's intermediates, then the chunks' output and one chunk: it peaks about where the default tier does, and
the saving starts at the second call. At a tier that admits ``high``
(``quality("high")``) the chunks run unverified from the first call, counted as such (:data:`UNVERIFIED`).

The module's own forward runs on each chunk, so whatever it holds (LoRA layers, quantised or fp8-stored weights
behind diffusers' hooks, accelpatch's in-place GELU) runs as it would; a forward hook inside it would see chunks
instead of the call, so a module with one runs whole (counted).
"""
from __future__ import annotations

import threading
from typing import Any, Callable, Iterator, Optional

import torch

from accelpatch.core.adapter import SiteRule
from accelpatch.core.gate import QualityGatedFusion
from accelpatch.core.outcomes import NotApplicable, not_applicable
from accelpatch.core.sites import FusedOpsPath, Site
from accelpatch.core.tiers import Tier, effective_tier
from accelpatch.lossless.inplace import global_hooks
from accelpatch.lossless.verify import (IN_AUTOGRAD, UNVERIFIED, ComposedOp, planned_signature, records_autograd,
                                        traced_first_sight)
from accelpatch.low_memory.feature import LowMemory, memory_mode

ONE_CHUNK = "its tokens fit one chunk (memory_chunk_tokens)"
OTHER_ARGUMENTS = "called with more than one tensor input (a chunked call splits only its input)"
HOOKED_INSIDE = "a forward hook on a module inside it (or a global one) would see each chunk instead of the call"
TRACED_CHUNKS = not_applicable("fake operands (a memory trace): planned as the chunks hold it, no values")
TRACED_WHOLE = not_applicable("fake operands (a memory trace): planned whole, as this process declined these shapes")


class Chunking:
    """The non-tensor argument of a chunked call: the module, the function to run on each chunk
    (``forward(module, *tensors)``, or ``forward(site, module, *tensors)`` when ``site`` is given: a restated
    forward's row-wise part calling fused ops) and the chunk. Equal (one verdict) for one function on modules of one
    structure (their ``repr``: classes and settings, a LoRA layer included; and training mode) whose parameters and
    buffers have the same types, dtypes, shapes and strides, at one chunk size: what can change the kernels the
    chunks and the whole call run."""

    __slots__ = ("module", "forward", "chunk", "site", "dim", "_key")

    def __init__(self, module: Optional[torch.nn.Module], forward: Callable, chunk: int, site: Any = None,
                 dim: Optional[int] = None) -> None:
        self.module, self.forward, self.chunk, self.site, self.dim = module, forward, chunk, site, dim
        self._key = None

    @property
    def key(self) -> tuple:
        """Worked out when a signature is looked up (eager only: a run at tier high needs none)."""
        if self._key is None:
            module = self.module
            self._key = (self.forward, self.chunk, self.dim, getattr(module, "training", None), repr(module),
                         _tensors_key(module))
        return self._key

    def __call__(self, *tensors: torch.Tensor):
        if self.site is None:
            return self.forward(self.module, *tensors)
        return self.forward(self.site, self.module, *tensors)

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, Chunking) and other.key == self.key

    def __hash__(self) -> int:
        return hash(self.key)

    def __repr__(self) -> str:
        unit = "tokens" if self.dim is None else f"along dimension {self.dim}"
        return f"{self.forward.__qualname__} in chunks of {self.chunk:,} {unit}"


def _tensors_key(module: Optional[torch.nn.Module]) -> tuple:
    if not isinstance(module, torch.nn.Module):
        return ()
    parts = []
    for name, tensor in (*module.named_parameters(), *module.named_buffers()):
        try:
            parts.append((name, type(tensor), tensor.dtype, tuple(tensor.shape), tensor.stride()))
        except (RuntimeError, NotImplementedError):  # a tensor subclass without strides: this module alone
            return (id(module),)
    return tuple(parts)


def token_dim(x: torch.Tensor) -> int:
    """The dimension chunks split: the longest before the last (the tokens of (batch, tokens, channels), and of
    (batch, tokens, heads, head_dim))."""
    sizes = x.shape[:-1]
    return max(range(len(sizes)), key=lambda d: (sizes[d], -d))


def chunks(*args: Any) -> Iterator[tuple[int, int, int, tuple, bool]]:
    """``how(*tensors)`` (``args`` = ``*tensors, how``) on chunks of ``how.chunk`` tokens of the first tensor (along
    ``how.dim``, else :func:`token_dim`):
    yields ``(token dimension, start, length, results, whether how returned a tuple)`` per chunk. A tensor as long
    as the first along its token dimension is sliced with it (the RoPE's cos/sin rows); the others (a modulation row
    of shape (batch, 1, channels)) go whole to every chunk. Raises TypeError where a result is not as long as its
    chunk."""
    *tensors, how = args
    x = tensors[0]
    dim = token_dim(x) if how.dim is None else how.dim % x.dim()
    total = x.shape[dim]
    aligned = [t.dim() > dim and t.shape[dim] == total for t in tensors]
    for start in range(0, total, how.chunk):
        length = min(how.chunk, total - start)
        pieces = how(*(t.narrow(dim, start, length) if a else t for t, a in zip(tensors, aligned)))
        several = isinstance(pieces, tuple)
        pieces = pieces if several else (pieces,)
        for piece in pieces:
            if not isinstance(piece, torch.Tensor) or piece.dim() <= dim or piece.shape[dim] != length:
                raise TypeError(f"{how.forward.__qualname__} is not row-wise over dimension {dim}: a chunk of "
                                f"{length} tokens gave {type(piece).__name__} {tuple(getattr(piece, 'shape', ()))}")
        yield dim, start, length, pieces, several
        del pieces, piece  # before the next chunk: one chunk's results alive at a time


def _order(piece: torch.Tensor) -> list[int]:
    """``piece``'s dimensions from the outermost in memory to the innermost (its strides, largest first)."""
    return sorted(range(piece.dim()), key=lambda d: (-piece.stride(d), d))


def whole_strides(piece: torch.Tensor, dim: int, total: int) -> tuple[int, ...]:
    """The strides of the dense tensor of ``piece``'s layout (its dimensions' order in memory: contiguous,
    channels-last, ...) with ``total`` along ``dim``: the layout the chunks' output is given."""
    shape = list(piece.shape)
    shape[dim] = total
    strides, step = [0] * piece.dim(), 1
    for d in reversed(_order(piece)):
        strides[d] = step
        step *= shape[d]
    return tuple(strides)


def run_in_chunks(*args: Any):
    """:func:`chunks`, each result written into one output in the layout of the chunk's result (contiguous for a
    row-wise result, channels-last for a convolution's; a first sight checks it is the whole call's). Returns a
    tensor, or a tuple where ``how`` returns one."""
    how = args[-1]
    total = args[0].shape[token_dim(args[0]) if how.dim is None else how.dim]
    outs, several = None, False
    for dim, start, length, pieces, several in chunks(*args):
        if outs is None:
            outs = [piece.new_empty_strided((*piece.shape[:dim], total, *piece.shape[dim + 1:]),
                                            whole_strides(piece, dim, total)) for piece in pieces]
        for out, piece in zip(outs, pieces):
            out.narrow(dim, start, length).copy_(piece)
        del pieces, piece
    return tuple(outs) if several else outs[0]


def _whole(*args: Any) -> torch.Tensor:
    *tensors, how = args
    return how(*tensors)


class _Chunks:
    """The chunked run in the place of a fused op's kernel (what a first sight and a verified call use of one:
    ``unsupported``, ``run``; availability and tracing are :class:`ChunkedOp`'s own)."""

    def unsupported(self, x: torch.Tensor, *rest: Any) -> Optional[str]:
        return None if x.dim() >= 2 else f"a {x.dim()}-dimensional input has no token dimension to chunk"

    def run(self, *args: Any) -> torch.Tensor:
        return run_in_chunks(*args)


class ChunkedOp(ComposedOp):
    """A row-wise computation run whole (the reference) or in chunks (the alternative), verified per signature like a
    fused op at the default tier; at a tier that admits ``high`` the chunks run unverified (counted
    :data:`UNVERIFIED`). Called as ``op(site, *tensors, Chunking(...))``; runs on any device (the chunks are the
    model's own code)."""

    #: the feature that runs this op: the report lists it only for models patched with it
    feature = LowMemory.name

    def __init__(self, name: str, description: str) -> None:
        super().__init__(name, _whole, description, _Chunks(), unverified_at_high=True)
        # a first sight's whole run can meet this op again (a chunked norm inside a chunked projection's reference)
        self._verifying = threading.RLock()

    def _traced(self, site: Any, args: tuple, device: torch.device):
        """A memory trace: the chunks run on the fake tensors (they allocate what they allocate for real), or the
        whole computation where this process has declined those shapes for real; a first call's trace runs the check
        in its real order: the whole result made, hashed and freed, then the chunks into one output."""
        if records_autograd(args):
            return self._reference(site, args, IN_AUTOGRAD)
        verdict = self._verdicts.get(planned_signature(args))
        declined = verdict is not None and not verdict.verified  # this process ran these shapes whole for real
        self.count(site, TRACED_WHOLE if declined else TRACED_CHUNKS)
        if traced_first_sight(args):  # the check as FusedOp._first_sight runs it on an out-of-place op
            self._traced_reference_hash(args)
            return run_in_chunks(*args)
        return self.reference(*args) if declined else run_in_chunks(*args)


CHUNKED = ChunkedOp("chunked_tokens", "a row-wise computation run chunk by chunk into one output")


def _hooked(module: Any, *, inside_only: bool) -> bool:
    """Whether a forward hook would see a chunk instead of the call: one on a module below ``module`` (or on
    ``module`` itself unless ``inside_only``: a site's own hooks run around its whole call), or a global one other
    than torch's module tracker."""
    if global_hooks(pre=True):
        return True
    if not isinstance(module, torch.nn.Module):
        return False
    return any(sub._forward_hooks or sub._forward_pre_hooks for sub in module.modules()
               if not (inside_only and sub is module))


def _chunk_size(site: Any, x: torch.Tensor, dim: Optional[int] = None, per_item: int = 1) -> Optional[int]:
    """The items of ``dim`` per chunk of this call, or None where it runs whole: memory='low' off, its tokens fit
    one chunk, or compiled code at a tier that does not admit high (no first sight can run there: the whole
    computation runs, as a fused op's chain does inside torch.compile)."""
    mode = memory_mode(site.model)
    if mode is None or x.dim() < 2:
        return None
    items = max(1, mode.chunk_tokens // per_item)
    if x.shape[token_dim(x) if dim is None else dim] <= items:
        return None
    if torch.compiler.is_compiling() and not effective_tier(site.model.default_tier).admits(Tier.HIGH):
        return None
    return items


def chunk_rows(site: Any, forward: Callable, module: Any, *tensors: torch.Tensor, dim: Optional[int] = None,
               per_item: int = 1, calls: Optional[tuple] = None):
    """``forward(site, module, *tensors)``, a restated forward's row-wise part (a norm and its modulation, a gated
    residual; ``module`` the module it calls, or None), computed in chunks of tokens under ``memory="low"``
    (:data:`CHUNKED`: verified at the default tier) and whole otherwise, or where a hook on ``module`` would see
    the chunks (counted). ``dim``: the dimension to split (default :func:`token_dim`), whose items hold
    ``per_item`` tokens each (a frame of a GLUMB convolution: height × width): a chunk is as many items as make
    ``memory_chunk_tokens`` tokens, at least one. ``calls``: the modules ``forward`` calls, whose hooks would see
    chunks (default: ``module``)."""
    chunk = _chunk_size(site, tensors[0], dim, per_item)
    if chunk is None:
        return forward(site, module, *tensors)
    if any(_hooked(called, inside_only=False) for called in (calls or (module,))):
        CHUNKED.count(site, not_applicable(HOOKED_INSIDE))
        return forward(site, module, *tensors)
    return CHUNKED(site, *tensors, Chunking(module, forward, chunk, site, dim))


class ChunkedTokens(FusedOpsPath):
    """A row-wise module (a feed-forward, a query/key norm) run in chunks of tokens under ``memory="low"``
    (:data:`CHUNKED`): its own forward on each chunk."""

    fusion = QualityGatedFusion.named("chunked_tokens", Tier.LOSSLESS)
    description = ("row-wise module (feed-forward, query/key norm) run in chunks of tokens into one output "
                   "(memory='low'; bit-exact, verified on first sight; unverified at tier high)")
    fused_ops = (CHUNKED,)
    policy_reasons = (ONE_CHUNK, OTHER_ARGUMENTS, HOOKED_INSIDE)

    def mount_reject_reason(self, module: torch.nn.Module, site: Site) -> Optional[str]:
        return None

    def run(self, module: torch.nn.Module, site: Site, args: tuple, kwargs: dict):
        tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
        if len(tensors) != 1 or len(args) + len(kwargs) != 1:
            return NotApplicable(OTHER_ARGUMENTS)
        chunk = _chunk_size(site, tensors[0])
        if chunk is None:
            return NotApplicable(ONE_CHUNK)
        if _hooked(module, inside_only=True):
            return NotApplicable(HOOKED_INSIDE)
        return CHUNKED(site, tensors[0], Chunking(module, site.original_forward, chunk))


CHUNKED_TOKENS = ChunkedTokens()


def chunked_rule(pattern: str) -> SiteRule:
    """The site-table row that runs the modules matching ``pattern`` (row-wise over their tokens: the longest
    dimension before the last) in chunks under ``memory="low"``."""
    return SiteRule(pattern, CHUNKED_TOKENS, feature=LowMemory.name)

"""Sol-Attn, block-sparse attention with dense guards, in one place (a ``high``-tier fast path):

- :mod:`.op`: the op itself (``sol_attn``, ``sol_attn_varlen``; PyTorch and Triton implementations, backward, AOT
  checks), typed through ``torch.library``;
- :mod:`.config`: ``SolAttnConfig``, the options and the one dense policy (``dense_steps``, ``dense_layers``);
- :mod:`.sites`: the fast paths a model's attention modules carry under ``apply(pipe, backend="sol_attn")``;
- :mod:`.adapter`: what every model adapter with a Sol-Attn backend shares (default dense layers, layer checks);
- :mod:`.diffusers_backend` and :mod:`.registration`: diffusers' own switch, ``set_attention_backend("sol_attn")``,
  registered only when asked (``accelpatch.sol_attn.register_attention_backend()``).

Model-specific parts (which modules, the packed layout of MiniMax-H3) stay with each model's adapter. Importing this
package imports nothing heavy (``import accelpatch`` reads ``SolAttnConfig`` from :mod:`.config`).

Public here (imported on first use): ``register_attention_backend``, ``configure_sol_attn_backend``,
``attention_backend_report``.
"""
from accelpatch._lazy import lazy_attributes

_LAZY = {name: "accelpatch.sol_attn.registration" for name in (
    "configure_sol_attn_backend", "attention_backend_report", "register_attention_backend")}

__getattr__ = lazy_attributes(__name__, _LAZY)

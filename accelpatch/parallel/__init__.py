"""Several processes on one generation: what accelpatch adds to diffusers' own parallelism.

- :mod:`.sequence`: the sequence group a model runs under after diffusers' ``enable_parallelism`` (the flattened
  ring × ulysses mesh), and the few collectives the token-mixing layers need beyond diffusers' split and gather hooks
  (the all-reduce of a linear attention's token sums, the halo of neighbouring frames, Ulysses' head exchange in the
  tensor's own dtype).
- :mod:`.cfg`: CFG parallelism (diffusers has none): the guided batch's branches on different ranks, one gather per
  call; :func:`~.cfg.parallel_mesh` builds the (cfg, ring, ulysses) mesh it shares with diffusers' sequence split.
- :mod:`.ranks`: which ranks must take a data-dependent decision together (the step cache's reuse).
- :mod:`.lifecycle`: what ``apply()``/``remove()`` check and undo on a split model.

Model-specific plans and layers live with each model (``accelpatch/models/<model>/``, our own models' modeling
code); this package knows no model.

Public here (imported on first use): ``enable_cfg_parallel``, ``disable_cfg_parallel``, ``parallel_mesh``,
``cfg_parallel_counts``.
"""
from accelpatch._lazy import lazy_attributes

_LAZY = {name: "accelpatch.parallel.cfg" for name in (
    "enable_cfg_parallel", "disable_cfg_parallel", "parallel_mesh", "cfg_parallel_counts")}

__getattr__ = lazy_attributes(__name__, _LAZY)

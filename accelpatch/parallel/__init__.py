"""Several processes on one generation: what accelpatch adds to diffusers' own parallelism.

- :mod:`.sequence`: the sequence group a model runs under after diffusers' ``enable_parallelism`` (the flattened
  ring × ulysses mesh), and the few collectives the token-mixing layers need beyond diffusers' split and gather hooks
  (the all-reduce of a linear attention's token sums, the halo of neighbouring frames, Ulysses' head exchange in the
  tensor's own dtype).

Model-specific plans and layers live with each model (``accelpatch/adapters/<model>/``, our own models' modeling
code); this package knows no model.
"""

"""The opt-in lower-memory mode, ``apply(pipe, memory="low")`` (issue #44 part 3): row-wise computations (the
feed-forwards, the query/key norms, the restated blocks' norms and residuals) run in chunks of tokens, verified
bit for bit on first sight at the default tier (:mod:`.chunked`); :mod:`.feature` hosts the argument and its
option. The planner that measures what it saves is :mod:`accelpatch.memory`."""

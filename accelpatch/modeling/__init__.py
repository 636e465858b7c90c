"""Model code accelpatch owns (models diffusers does not ship), one package per model, in diffusers format.
Adapters (how accelpatch patches a model) live in accelpatch.adapters."""

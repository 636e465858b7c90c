"""Fast paths, one module per kind; each states its tier, its guards and its math, and delegates to the original
diffusers code whenever it does not run."""

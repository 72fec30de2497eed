"""Model backends behind `Model` (exports, `.pt2` packages, live transformers objects, TinyGPT) and the exporters
that write them (models/export)."""

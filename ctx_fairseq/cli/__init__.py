"""Console scripts (ctx-make-toy, ctx-demo, ctx-bench, ...)."""

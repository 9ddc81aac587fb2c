"""What a model is and where it runs: catalog, architecture facts, hardware, memory fit, placement, loading, the model runner, the default offline pair."""

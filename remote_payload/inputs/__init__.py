"""What the eval consumes: prompts, reference continuations (local or from a server), features, caches."""

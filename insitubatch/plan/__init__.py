"""Planning before the first byte: splits by chunk, each epoch's order and reads, ranks' shares, and what a configuration costs."""

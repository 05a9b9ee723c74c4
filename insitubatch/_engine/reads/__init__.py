"""A key and an optional byte range in, its bytes out: read permits, concurrency, retries, hedging, shard indexes."""

"""One pass from its plan to batches: the context it reads, the driver on the loop, the producer thread, gather, hand-over."""

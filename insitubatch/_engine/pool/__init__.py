"""What is resident: the chunk pool's entries under a byte budget, free tiles for reuse, and batch buffers."""

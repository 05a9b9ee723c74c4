"""Between a store key and its bytes on the wire: the engine's own HTTP/1.1 client, S3 signing, obstore's client."""

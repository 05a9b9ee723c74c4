"""One dataset from many stores: stores joined by variable (``join_stores``) or concatenated along time (``concat_stores``)."""

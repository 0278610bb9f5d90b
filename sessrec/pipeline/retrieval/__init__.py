"""Stage 1: retrievers (session models through an index, kNN baselines, co-visitation) and their indexes."""

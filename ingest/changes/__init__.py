"""Changes between the source and the sink: the upsert materializer."""

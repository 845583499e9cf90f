"""Changes between the source and the sink: one final row per key (the upsert materializer), changelog rows,
values Iceberg cannot hold."""

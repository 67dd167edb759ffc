"""The name server: route table, broker registration and expiry, KV config."""

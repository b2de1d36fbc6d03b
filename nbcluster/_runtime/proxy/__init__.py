"""Client mode: the proxy driver that serves remote notebooks through the head."""

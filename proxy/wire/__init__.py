"""The wire format, sans-IO: SSE parsing, stream assembly, error bodies."""

"""Loop detection, sans-IO: plain data in, verdicts out."""

"""loopwarden inside other gateways: each module adapts one gateway's hooks to the inspection step."""

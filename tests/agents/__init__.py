import os

# In CI (and with LOOPWARDEN_REQUIRE_AGENTS=1, which `.ci/run` sets) a real agent that is not installed fails
# its check; elsewhere the check is skipped, saying what to install.
REQUIRE_AGENTS = os.environ.get("CI") == "true" or os.environ.get("LOOPWARDEN_REQUIRE_AGENTS") == "1"

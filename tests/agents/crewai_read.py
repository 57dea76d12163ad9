"""A CrewAI crew of one agent with one tool (read a file), CrewAI's defaults, its model pointed at loopwarden.

    .venv-frameworks/crewai/bin/python tests/agents/crewai_read.py BASE_URL FILE

Prints one JSON line: the crew's answer or the errors that ended it, and how often the tool ran."""

import json
import os
import sys

for name in ("CREWAI_DISABLE_TELEMETRY", "OTEL_SDK_DISABLED", "CREWAI_DISABLE_TRACKING"):
    os.environ.setdefault(name, "true")
os.environ.setdefault("CREWAI_TRACING_ENABLED", "false")

from crewai import LLM, Agent, Crew, Task  # noqa: E402
from crewai.tools import tool  # noqa: E402

ran = []


@tool("read_file")
def read_file(path: str) -> str:
    """Read a text file and return its contents."""
    ran.append(path)
    with open(path, encoding="utf-8") as handle:
        return handle.read()


base_url, path = sys.argv[1:3]
llm = LLM(model="openai/gpt-4o", base_url=base_url, api_key="sk-local-1", max_retries=0)
agent = Agent(role="reader", goal="Answer from the files", backstory="You read files.", tools=[read_file], llm=llm)
crew = Crew(agents=[agent], tasks=[Task(description=f"What does {path} say?", expected_output="Its contents.",
                                        agent=agent)])
out = {}
try:
    out["answer"] = str(crew.kickoff())
except Exception as error:  # what ended the run, with its causes
    out["errors"] = []
    while error is not None and len(out["errors"]) < 6:
        out["errors"].append(f"{type(error).__name__}: {str(error)[:400]}")
        error = error.__cause__ or error.__context__
out["ran"] = len(ran)
print(json.dumps(out))

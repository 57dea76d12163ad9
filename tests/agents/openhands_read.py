"""An OpenHands SDK agent with its file editor, the SDK's defaults (its StuckDetector on), its model pointed at
loopwarden through LiteLLM.

    .venv-frameworks/openhands/bin/python tests/agents/openhands_read.py BASE_URL FILE

Prints one JSON line: the conversation's status, how many actions ran, and the error that ended it, if any."""

import json
import os
import sys
import tempfile

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no fetch of LiteLLM's price list
os.environ.setdefault("OPENHANDS_SUPPRESS_BANNER", "1")

from pydantic import SecretStr  # noqa: E402

from openhands.sdk import LLM, Agent, Conversation, Tool  # noqa: E402
from openhands.sdk.event import ActionEvent  # noqa: E402
from openhands.tools.file_editor import FileEditorTool  # noqa: E402

base_url, path = sys.argv[1:3]
# No retries: a refused request is not retried after 8-64 s waits.
llm = LLM(model="openai/gpt-4o", base_url=base_url, api_key=SecretStr("sk-local-1"), num_retries=0, usage_id="agent")
events = []
conversation = Conversation(agent=Agent(llm=llm, tools=[Tool(name=FileEditorTool.name)]),
                            workspace=tempfile.mkdtemp(), callbacks=[events.append], visualizer=None)
conversation.send_message(f"What does {path} say?")
out = {}
try:
    conversation.run()
except Exception as error:
    out["error"] = f"{type(error).__name__}: {str(error)[:400]}"
out["status"] = str(conversation.state.execution_status.value)
out["actions"] = sum(isinstance(event, ActionEvent) for event in events)
out["tool"] = FileEditorTool.name
print(json.dumps(out))

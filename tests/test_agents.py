"""The agent a request names in its headers, and a session's title: from captured requests of real agents."""

from __future__ import annotations

import pytest

from proxy.agents import agent_name, agent_of, session_title, title_of

STAINLESS_PY = {"X-Stainless-Lang": "python", "X-Stainless-OS": "Linux", "X-Stainless-Arch": "x64",
                "X-Stainless-Runtime": "CPython", "X-Stainless-Runtime-Version": "3.11.7"}
STAINLESS_JS = {"x-stainless-lang": "js", "x-stainless-os": "Linux", "x-stainless-runtime": "node",
                "x-stainless-runtime-version": "v20.20.2"}

# Header sets as captured (authorization, host and lengths left out).
CAPTURED = [
    ("Claude Code 2.1.330", {"User-Agent": "claude-cli/2.1.330 (external, cli)", "anthropic-version": "2023-06-01",
                             **STAINLESS_JS, "x-stainless-package-version": "0.70.0"}),
    ("Claude Agent SDK (Python) 2.1.330", {"User-Agent": "claude-cli/2.1.330 (external, sdk-py)"}),
    ("Claude Code 2.1.330", {"User-Agent": "claude-cli/2.1.330 (external, sdk-cli)"}),  # `claude -p`
    ("Codex CLI 0.169.0", {"User-Agent": "codex_cli_rs/0.169.0 (Debian 12.0.0; x86_64) xterm-256color (codex-exec; 0.169.0)",
                           "originator": "codex_cli_rs", "session_id": "0199a1b2"}),
    ("Codex CLI (exec) 0.169.0", {"User-Agent": "codex_exec/0.169.0 (Debian 12.0.0; x86_64) dumb",
                                  "originator": "codex_exec"}),
    ("Gemini CLI 0.61.0", {"User-Agent": "GeminiCLI-tui/0.61.0/gemini-3.1-pro-preview (linux; x64; terminal)",
                           "x-goog-api-client": "google-genai-sdk/1.30.0 gl-node/v20.20.2"}),
    ("Gemini CLI 0.60.1", {"User-Agent": "GeminiCLI/0.60.1/gemini-2.5-pro (darwin; arm64; terminal)"}),
    ("Qwen Code 0.15.10", {"User-Agent": "QwenCode/0.15.10 (linux; x64)", **STAINLESS_JS,
                           "X-Stainless-Package-Version": "5.11.0"}),
    ("OpenCode 1.18.33", {"User-Agent": "opencode/1.18.33 ai-sdk/provider-utils/4.0.23 runtime/bun/1.3.14",
                          "x-session-affinity": "ses_df31ef0e2ffe68tBchF33zn56a"}),
    ("Kilo Code 7.7.9", {"User-Agent": "Kilo-Code/7.7.9 ai-sdk/provider-utils/4.0.27 runtime/bun/1.3.14",
                         "http-referer": "https://kilocode.ai", "x-title": "Kilo Code"}),
    ("Cline", {"User-Agent": "ai-sdk/openai-compatible/3.0.37 ai-sdk/provider-utils/5.0.30 runtime/bun/1.3.13"}),
    ("Cline", {"User-Agent": "OpenAI/JS 4.96.0", "HTTP-Referer": "https://cline.bot", "X-Title": "Cline",
               **STAINLESS_JS}),
    ("Aider", {"User-Agent": "OpenAI/Python 1.99.0", "HTTP-Referer": "https://aider.chat", "X-Title": "Aider"}),
    ("AI SDK (openai) 2.0.131", {"User-Agent": "ai-sdk/openai/2.0.131 ai-sdk/provider-utils/3.0.40 "
                                               "runtime/node.js/v20.20.2"}),
    ("google-genai (Python) 3.4.0", {"User-Agent": "google-genai-sdk/3.4.0 gl-python/3.11.7",
                                     "x-goog-api-client": "google-genai-sdk/3.4.0 gl-python/3.11.7"}),
    ("ADK 2.13.0", {"User-Agent": "google-genai-sdk/2.34.0 gl-python/3.11.7 google-adk/2.13.0 gl-python/3.11.7",
                    "x-goog-api-client": "google-genai-sdk/2.34.0 gl-python/3.11.7 google-adk/2.13.0 gl-python/3.11.7"}),
    # Aider (through litellm), CrewAI and ADK on an OpenAI endpoint: the SDK is all their headers say.
    ("OpenAI SDK (Python) 2.20.0", {"User-Agent": "OpenAI/Python 2.20.0", **STAINLESS_PY,
                                    "X-Stainless-Package-Version": "2.20.0", "X-Stainless-Async": "false"}),
    ("OpenAI SDK (Python) 2.54.0", {"User-Agent": "AsyncOpenAI/Python 2.54.0", **STAINLESS_PY,
                                    "X-Stainless-Package-Version": "2.54.0", "x-stainless-async": "async:asyncio"}),
    # Continue: the OpenAI JS SDK, its client class renamed by a bundler.
    ("OpenAI SDK (TypeScript) 5.23.2", {"User-Agent": "ls/JS 5.23.2", **STAINLESS_JS,
                                        "x-stainless-package-version": "5.23.2"}),
    ("Anthropic SDK (TypeScript) 0.60.0", {"User-Agent": "Anthropic/JS 0.60.0", **STAINLESS_JS,
                                           "x-stainless-package-version": "0.60.0", "anthropic-version": "2023-06-01"}),
    ("Anthropic SDK (Python) 0.69.0", {"User-Agent": "AsyncAnthropic/Python 0.69.0", **STAINLESS_PY,
                                       "X-Stainless-Package-Version": "0.69.0", "anthropic-version": "2023-06-01"}),
    # An agent of its own on an SDK: its User-Agent names it; the SDK's headers alone name the SDK.
    ("MyAgent 1.2", {"User-Agent": "MyAgent/1.2", **STAINLESS_PY, "X-Stainless-Package-Version": "2.54.0"}),
    ("OpenAI SDK (Python) 2.54.0", {**STAINLESS_PY, "X-Stainless-Package-Version": "2.54.0"}),
    # Later AI SDK releases write the provider package with a hyphen (Mastra 1.71 on @ai-sdk/openai 4.0.118).
    ("AI SDK (openai) 4.0.118", {"User-Agent": "ai-sdk-openai/4.0.118 ai-sdk-provider-utils/5.0.81 node.js/v20.20.2"}),
    ("OpenAI Agents SDK (Python) 0.24.0", {"User-Agent": "Agents/Python 0.24.0", **STAINLESS_PY,
                                           "X-Stainless-Package-Version": "3.57.0",
                                           "x-stainless-async": "async:asyncio"}),
    ("Pydantic AI 2.66.0", {"User-Agent": "pydantic-ai/2.66.0", **STAINLESS_PY,
                            "X-Stainless-Package-Version": "3.57.0"}),
    ("OpenHands", {"User-Agent": "OpenAI/Python 2.54.0", **STAINLESS_PY, "X-Stainless-Package-Version": "2.54.0",
                   "http-referer": "https://docs.all-hands.dev/", "x-title": "OpenHands",
                   "x-litellm-session-id": "ae026fc9-d522-4e65-8852-4ed2bbcc3b8c"}),
    # Continue with `requestOptions: {headers: {X-Title: Continue}}` in its model's config.
    ("Continue", {"User-Agent": "ls/JS 5.23.2", **STAINLESS_JS, "x-stainless-package-version": "5.23.2",
                  "x-title": "Continue"}),
    ("curl 8.5.0", {"User-Agent": "curl/8.5.0"}),
    ("python-httpx 0.28.1", {"User-Agent": "python-httpx/0.28.1"}),
]


@pytest.mark.parametrize("expected,headers", CAPTURED, ids=[expected for expected, _ in CAPTURED])
def test_each_agent_is_named_with_its_version(expected, headers):
    assert agent_name(headers) == expected


def test_no_headers_name_no_agent():
    assert agent_name({}) is None
    assert agent_of({"User-Agent": "   "}) is None


def test_a_client_controlled_value_is_cut_and_printable():
    named = agent_name({"User-Agent": "x" * 5000 + "/1.0"})
    assert len(named) <= 128
    named = agent_name({"X-Title": "<b>evil</b>\x1b[31m\nline" + "y" * 500})
    assert "\n" not in named and "\x1b" not in named and len(named) <= 128


def test_headers_are_read_whatever_their_case():
    from multidict import CIMultiDict
    assert agent_name(CIMultiDict({"user-agent": "claude-cli/2.0.1 (external, cli)"})) == "Claude Code 2.0.1"


def test_a_title_is_the_prompt_masked_on_one_line_and_cut():
    assert title_of("fix the bug in a.py") == "fix the bug in a.py"
    assert title_of("") is None and title_of("   \n ") is None
    title = title_of("Deploy at 2026-05-01T10:00:00Z the build\n\n  for request_id=ab12cd34ef run 3f2a9c1d7e")
    assert title == "Deploy at … the build for request_id=… run …"
    long = title_of("word " * 100)
    assert len(long) == 120 and long.endswith("…")


def test_an_agents_reminders_before_the_prompt_are_not_the_title():
    prompt = "<system-reminder>\nAs you answer, use the context below.\n</system-reminder>\nrename the config loader"
    assert title_of(prompt) == "rename the config loader"


def test_a_title_holds_no_control_characters():
    assert title_of("a\x01b\u2028c\td\x7f") == "a b c d"
    assert title_of("colour \x1b[31mred\x1b[0m here") == "colour red here"


def test_context_an_agent_appends_to_the_prompt_is_not_the_title():
    prompt = '"rename the loader"\n\n<environment_details>\nMessage time: 2026-11-24T12:49:57Z\n' \
             'Working directory: /work/app\n</environment_details>'
    assert title_of(prompt) == "rename the loader"  # Kilo Code quotes the prompt: the quotes are not the title


def test_a_sessions_title_is_the_first_prompt_a_person_wrote():
    """The user texts of first requests, as real agents sent them."""
    # Codex CLI: its environment in a user message of its own, then the prompt.
    codex = ["<environment_context>\n  <cwd>/work/app</cwd>\n  <shell>bash</shell>\n</environment_context>",
             "Summarise the file notes.txt in one line"]
    assert session_title(codex) == "Summarise the file notes.txt in one line"
    # Aider: an example conversation ended by its note, its file-context message, then the prompt.
    aider = ["Change the greeting to be more casual",
             "I switched to a new code base. Please don't consider the above files or try to edit them any longer.",
             "I have *added these files to the chat* so you can go ahead and edit them.\n\nnotes.txt\n```\n```",
             "Set beta to 3 in notes.txt"]
    assert session_title(aider) == "Set beta to 3 in notes.txt"
    # OpenCode's title request (the same session header as its conversation, and sometimes first).
    opencode = ["Generate a title for this conversation:\n", '"Summarise the file notes.txt in one line"']
    assert session_title(opencode) == "Summarise the file notes.txt in one line"
    # Kilo Code's title request quotes the first prompt inside its instruction.
    kilo = ["Generate a title for this conversation:\n\nTitle the task, not the reference.\n\n"
            'User messages, oldest to newest:\n1. "Read notes.txt and tell me alpha"\n\nWork done so far:\n- read']
    assert session_title(kilo) == "Read notes.txt and tell me alpha"
    assert session_title(["fix a.py", "now b.py"]) == "fix a.py"
    assert session_title([]) is None and session_title(["<environment_context>x</environment_context>"]) is None


def test_an_agent_frameworks_framing_and_gemini_clis_context_are_not_the_title():
    gemini_cli = "<session_context>\nThis is the Gemini CLI. We are setting up the context.\n</session_context>\n" \
                 "Make the tests pass"
    crewai = "Current Task: Find the bug in calc.py\n\nThis is the expected criteria for your final answer: a fix\n" \
             "you MUST return the actual complete content as the final answer, not a summary."
    assert title_of(gemini_cli) == "Make the tests pass"
    assert title_of(crewai) == "Find the bug in calc.py"
    assert title_of("New task:\nFind the bug in calc.py") == "Find the bug in calc.py"  # smolagents
    assert title_of('Fix the "login" page') == 'Fix the "login" page'  # quotes inside a prompt stay


def test_openhands_worked_example_before_the_task_is_not_the_title():
    # OpenHands' first user message for a model without native tool calls (SDK 1.58): a worked example, then the task.
    example = ("Here's a running example of how to perform a task with the provided tools.\n\n"
               "--------------------- START OF EXAMPLE ---------------------\n\nUSER: Create a list of numbers from 1 "
               "to 10, and display them in a web page at port 5000.\n\nASSISTANT: Sure! Let me first check the "
               "current directory:\n<function=terminal>\n<parameter=command>\npwd && ls\n</parameter>\n</function>\n"
               + "USER: EXECUTION RESULT of [terminal]:\n/workspace\n" * 200
               + "--------------------- END OF EXAMPLE ---------------------\n\n")
    prompt = (example + "--------------------- NEW TASK DESCRIPTION ---------------------\nThe test in "
              "tests/test_x.py fails. Find out why and fix it.\n--------------------- END OF NEW TASK DESCRIPTION "
              "---------------------\n\nPLEASE follow the format strictly! PLEASE EMIT ONE AND ONLY ONE FUNCTION "
              "CALL PER MESSAGE.\n")
    assert len(example) > 7000
    assert title_of(prompt) == "The test in tests/test_x.py fails. Find out why and fix it."

"""Which agent sent a request, read from its headers, and a session's title, read from its first prompt.

Pure functions: headers (or a text) in, a short printable string out. The readers are tried in order; the
first that knows the request names it. Agents built on an SDK say so in their User-Agent before the SDK's
own headers do, so the agents come first, the SDKs after, and a bare User-Agent's first product last.
"""

from __future__ import annotations

import re
from typing import Callable, Iterable, Mapping, NamedTuple

from proxy.detect.normalize import mask
from proxy.detect.text_steps import is_agent_preamble, task_text, without_reminder

AGENT_LENGTH = 128  # the sessions table's column
TITLE_LENGTH = 120
_NAME_LENGTH = 64
_VERSION_LENGTH = 32
_TITLE_READ = 2000  # characters of a prompt read for its title: a pasted file is not masked whole


class Agent(NamedTuple):
    name: str
    version: str = ""

    def __str__(self) -> str:
        return f"{self.name} {self.version}" if self.version else self.name


_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\ufeff]")
_VERSION = re.compile(r"v?(\d[\w.+-]*)")


def _printable(text: str, length: int) -> str:
    return " ".join(_UNPRINTABLE.sub(" ", text).split())[:length]


def _version(text: str) -> str:
    match = _VERSION.match(text.strip())
    return match.group(1)[:_VERSION_LENGTH] if match else ""


def _header(headers: Mapping[str, str], name: str) -> str:
    return (headers.get(name.lower()) or "").strip()  # the names are lower-cased by agent_of


# -- the agents ---------------------------------------------------------------------------------------------

_CLAUDE = re.compile(r"claude-cli/(\S+)(?:\s*\(([^)]*)\))?")
# `sdk-cli` is Claude Code's own print mode (`claude -p`): Claude Code, as any other entry point not listed.
_CLAUDE_ENTRYPOINTS = {"sdk-py": "Claude Agent SDK (Python)", "sdk-ts": "Claude Agent SDK (TypeScript)"}
_CODEX = re.compile(r"(codex_[a-z_]+)/(\S+)")
_CODEX_ORIGINATORS = {"codex_cli_rs": "Codex CLI", "codex_exec": "Codex CLI (exec)",
                      "codex_vscode": "Codex (VS Code)"}
_GEMINI_CLI = re.compile(r"GeminiCLI(?:-[\w-]+)?/([^/\s]+)")
# `<product>/<version>` first in the User-Agent, for the agents that put themselves there.
_PRODUCTS = {"qwencode": "Qwen Code", "opencode": "OpenCode", "kilo-code": "Kilo Code", "cline": "Cline",
             "roo-code": "Roo Code", "continue": "Continue", "crush": "Crush", "goose": "Goose",
             "cursor": "Cursor", "windsurf": "Windsurf", "zed": "Zed", "aider": "Aider", "openhands": "OpenHands",
             "amp": "Amp", "copilot": "GitHub Copilot", "githubcopilotchat": "GitHub Copilot Chat",
             "pydantic-ai": "Pydantic AI"}
_PRODUCT = re.compile(r"([A-Za-z][\w.-]*)/(\S+)")
_ANY_PRODUCT = re.compile(r"([^/\s]+)/(\S+)")
# OpenRouter's attribution headers, which agents send under their own name.
_TITLED = {"cline": "Cline", "kilo code": "Kilo Code", "roo code": "Roo Code", "aider": "Aider"}


def _claude_code(headers: Mapping[str, str], agent: str) -> Agent | None:
    match = _CLAUDE.search(agent)
    if match is None:
        return None
    entry = (match.group(2) or "").split(",")[-1].strip()
    return Agent(_CLAUDE_ENTRYPOINTS.get(entry, "Claude Code"), _version(match.group(1)))


def _codex(headers: Mapping[str, str], agent: str) -> Agent | None:
    match = _CODEX.match(agent)
    originator = _header(headers, "originator")
    if match is None and not originator.startswith("codex"):
        return None
    name = originator or match.group(1)
    return Agent(_CODEX_ORIGINATORS.get(name, "Codex"), _version(match.group(2)) if match else "")


def _gemini_cli(headers: Mapping[str, str], agent: str) -> Agent | None:
    match = _GEMINI_CLI.match(agent)
    return Agent("Gemini CLI", _version(match.group(1))) if match else None


def _named_product(headers: Mapping[str, str], agent: str) -> Agent | None:
    match = _PRODUCT.match(agent)
    if match is None:
        return None
    name = _PRODUCTS.get(match.group(1).lower())
    return Agent(name, _version(match.group(2))) if name else None


def _titled(headers: Mapping[str, str], agent: str) -> Agent | None:
    """An agent that names itself in X-Title (OpenRouter's app attribution), or Cline's referer."""
    title = _header(headers, "X-Title")
    if title:
        return Agent(_TITLED.get(title.lower(), _printable(title, _NAME_LENGTH)))
    referer = _header(headers, "HTTP-Referer")
    if "cline.bot" in referer:
        return Agent("Cline")
    return None


def _cline(headers: Mapping[str, str], agent: str) -> Agent | None:
    """Cline's CLI: the AI SDK's OpenAI-compatible provider on Bun, with no product of its own in front
    (OpenCode and Kilo Code, also on Bun, put theirs first)."""
    if agent.startswith("ai-sdk/openai-compatible/") and " runtime/bun/" in agent:
        return Agent("Cline")
    return None


# -- the SDKs -----------------------------------------------------------------------------------------------

_LANGUAGES = {"python": "Python", "js": "TypeScript", "node": "TypeScript", "go": "Go", "java": "Java",
              "kotlin": "Kotlin", "ruby": "Ruby", "csharp": ".NET", "dotnet": ".NET", "php": "PHP", "rust": "Rust"}
_ADK = re.compile(r"google-adk/(\S+)")
_GENAI = re.compile(r"google-genai-sdk/(\S+)(?:.*?\bgl-(\w+)/)?")
# `ai-sdk/openai/2.0.131` (AI SDK 5) or `ai-sdk-openai/4.0.118` (later releases); never the utilities package.
_AI_SDK = re.compile(r"ai-sdk[/-](?!provider-utils/)([\w-]+)/(\S+)")
_OPENAI_AGENTS = re.compile(r"Agents/(\w+) (\S+)")  # the OpenAI Agents SDK, on the OpenAI SDK's headers
_STAINLESS_UA = re.compile(r"(\w+)/(\w+) (\S+)")  # OpenAI/Python 2.20.0, Anthropic/JS 0.60.0


def _adk(headers: Mapping[str, str], agent: str) -> Agent | None:
    match = _ADK.search(agent) or _ADK.search(_header(headers, "x-goog-api-client"))
    return Agent("ADK", _version(match.group(1))) if match else None


def _google_genai(headers: Mapping[str, str], agent: str) -> Agent | None:
    match = _GENAI.search(agent) or _GENAI.search(_header(headers, "x-goog-api-client"))
    if match is None:
        return None
    language = _LANGUAGES.get((match.group(2) or "").lower(), "")
    return Agent(f"google-genai ({language})" if language else "google-genai", _version(match.group(1)))


def _openai_agents(headers: Mapping[str, str], agent: str) -> Agent | None:
    """The OpenAI Agents SDK: its own `Agents/Python 0.24.0` in front of the OpenAI SDK's `x-stainless-*`."""
    match = _OPENAI_AGENTS.match(agent)
    if match is None or not _header(headers, "x-stainless-lang"):
        return None
    language = _LANGUAGES.get(match.group(1).lower(), _printable(match.group(1), 16))
    return Agent(f"OpenAI Agents SDK ({language})", _version(match.group(2)))


def _ai_sdk(headers: Mapping[str, str], agent: str) -> Agent | None:
    """Vercel's AI SDK (Mastra and others build on it): its provider package and that package's version."""
    match = _AI_SDK.search(agent)
    if match is None:
        return None
    return Agent(f"AI SDK ({match.group(1)})", _version(match.group(2)))


def _stainless(headers: Mapping[str, str], agent: str) -> Agent | None:
    """The OpenAI and Anthropic SDKs (and others generated the same way): `x-stainless-lang` and
    `x-stainless-package-version`. A bundler may rename the client class in the User-Agent (`ls/JS 5.23.2`);
    then an `anthropic-version` header tells Anthropic's from OpenAI's."""
    language = _header(headers, "x-stainless-lang").lower()
    match = _STAINLESS_UA.match(agent)
    if match is None and (agent or not language):
        return None  # a User-Agent of the client's own says more than the SDK under it
    if not language and match.group(2).lower() not in _LANGUAGES:
        return None
    client = (match.group(1) if match else "").lower().removeprefix("async")
    if "anthropic" in client:
        vendor = "Anthropic"
    elif "openai" in client:
        vendor = "OpenAI"
    elif not language:
        return None  # some other product/Language pair: the bare User-Agent reader names it
    else:
        vendor = "Anthropic" if _header(headers, "anthropic-version") else "OpenAI"
    language = language or match.group(2).lower()
    name = f"{vendor} SDK ({_LANGUAGES.get(language, _printable(language, 16))})"
    version = _header(headers, "x-stainless-package-version") or (match.group(3) if match else "")
    return Agent(name, _version(version))


def _first_product(headers: Mapping[str, str], agent: str) -> Agent | None:
    """Anything else: the User-Agent's first product (`curl/8.5.0`, `python-httpx/0.27.0`)."""
    match = _ANY_PRODUCT.match(agent)
    if match is not None:
        return Agent(_printable(match.group(1), _NAME_LENGTH), _version(match.group(2)))
    name = _printable(agent.split(" ", 1)[0], _NAME_LENGTH) if agent else ""
    return Agent(name) if name else None


# In order: the first reader that knows the request names its agent.
READERS: tuple[Callable[[Mapping[str, str], str], Agent | None], ...] = (
    _claude_code, _codex, _gemini_cli, _named_product, _titled, _cline, _adk, _google_genai, _ai_sdk, _openai_agents,
    _stainless, _first_product,
)


def agent_of(headers: Mapping[str, str]) -> Agent | None:
    """The agent (name and version) that sent a request, or None when its headers say nothing."""
    headers = {name.lower(): value for name, value in headers.items()}
    agent = _printable(_header(headers, "User-Agent"), 512)
    for reader in READERS:
        found = reader(headers, agent)
        if found is not None:
            return found
    return None


# Agents that send only their SDK's headers, told by the system prompt they send (its rules for edits).
_SYSTEM_MARKS = (("*SEARCH/REPLACE block* Rules", "Aider"),)


def agent_name(headers: Mapping[str, str], system: str = "") -> str | None:
    """The agent as the sessions table keeps it: `Claude Code 2.1.330`. An agent whose headers name only the
    SDK it is built on is named by its system prompt where that is its own (Aider's: no version, as it sends
    none)."""
    found = agent_of(headers)
    if (found is None or found.name.startswith("OpenAI SDK")) and system:
        agent = next((name for mark, name in _SYSTEM_MARKS if mark in system), None)
        if agent is not None:
            found = Agent(agent)
    return str(found)[:AGENT_LENGTH] if found is not None else None


# -- the title ----------------------------------------------------------------------------------------------

# What an agent puts before a person's words in the same message: Claude Code's reminders, an IDE's context.
_LEADING_BLOCKS = re.compile(r"\A(?:\s*<(system-reminder|environment_context|user_instructions|session_context|"
                             r"ide_[\w-]+)>.*?</\1>)+", re.DOTALL)
# How agent frameworks frame the person's task around it: CrewAI's `Current Task: … This is the expected criteria
# for your final answer: …`, smolagents' `New task:`.
_FRAMING = re.compile(r"\A\s*(?:Current Task:|New task:)\s*")
_CRITERIA = "\n\nThis is the expected criteria for your final answer:"

# OpenHands, for a model without native tool calls, opens the first user message with a worked example (about 7 KB)
# and frames the person's task after it.
_EXAMPLE_START = "Here's a running example of how to perform a task with the provided tools."
_EXAMPLE_TASK = "--------------------- NEW TASK DESCRIPTION ---------------------\n"
_EXAMPLE_TASK_END = "\n--------------------- END OF NEW TASK DESCRIPTION"
_EXAMPLE_READ = 32_000  # the task's frame is looked for this far into the message

# Context an agent appends to a person's words in the same message (Kilo Code's, Cline's, Roo Code's).
_TRAILING_BLOCKS = re.compile(r"<environment_details>.*?</environment_details>", re.DOTALL)

_ANSI = re.compile(r"\x1b(?:\[[0-9;?]*[\x20-\x2f]*[\x40-\x7e]|\][^\x07\x1b]*(?:\x07|\x1b\\))")


def title_of(prompt: str) -> str | None:
    """A session's title: its first prompt, masked (times, dates, ids, temporary paths), on one line, cut to
    120 characters. None for an empty prompt."""
    if not prompt:
        return None
    example_end = prompt.find(_EXAMPLE_TASK, 0, _EXAMPLE_READ) if prompt.startswith(_EXAMPLE_START) else -1
    if example_end >= 0:  # OpenHands' worked example, for a model without native tool calls, then the task
        prompt = prompt[example_end + len(_EXAMPLE_TASK):].split(_EXAMPLE_TASK_END, 1)[0]
    text = _TRAILING_BLOCKS.sub("", _LEADING_BLOCKS.sub("", prompt, count=1)[:_TITLE_READ * 4])
    framed = _FRAMING.match(text)
    if framed is not None:
        text = text[framed.end():].split(_CRITERIA, 1)[0]
    text = _ANSI.sub("", text[:_TITLE_READ]).strip()
    if len(text) > 1 and text[0] == text[-1] and text[0] in "\"'`":  # a title quoted (OpenCode's, Kilo Code's)
        text = text[1:-1]
    text = _printable(mask(text).replace("\x00", "…"), _TITLE_READ)
    if len(text) > TITLE_LENGTH:
        text = text[:TITLE_LENGTH - 1].rstrip() + "…"
    return text or None


# What agents write in a person's place before the person's prompt, in the first request of a session.
_EXAMPLES_END = "I switched to a new code base."  # Aider: its example conversation ends with this note
_TITLE_REQUEST = "Generate a title for this conversation:"  # OpenCode's and Kilo Code's title side request
_QUOTED_PROMPT = re.compile(r"User messages, oldest to newest:\s*1\. (.+)")  # Kilo Code quotes the prompt in it


def session_title(prompts: Iterable[str], system: str = "") -> str | None:
    """A session's title from the user texts of its first request, in order: the first a person wrote that has
    a title. Passed over: an agent's own preamble (Aider's file-context message, Qwen Code's environment),
    Aider's example conversation (every text up to the note that ends it), the instruction of a title request
    (OpenCode's; in Kilo Code's, the person's first prompt quoted inside it is taken) and a text made only of
    an agent's context (Codex CLI's `<environment_context>` message). The reminder an agent appends to the
    newest message (the end of its `system` text, as Aider does) is cut."""
    texts = list(prompts)
    end = next((i for i, text in enumerate(texts) if text.lstrip().startswith(_EXAMPLES_END)), None)
    for text in texts[end + 1:] if end is not None else texts:
        if is_agent_preamble(text):
            continue
        if text.lstrip().startswith(_TITLE_REQUEST):
            quoted = _QUOTED_PROMPT.search(text[:_TITLE_READ * 4])
            if quoted is None:
                continue
            text = quoted.group(1)
        title = title_of(task_text(without_reminder(text, system)))
        if title:
            return title
    return None

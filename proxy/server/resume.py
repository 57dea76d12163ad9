"""`/loopwarden/resume/<token>`: the person running an agent lets a stopped session go on.

A stop's message names a one-time link bound to its session and task (SPEC §4). It needs no admin token and
unlocks nothing else: GET shows what will be resumed, and a button POSTs the confirmation value the page holds,
so a tool that only fetches the link resumes nothing. Used once, the link is spent; the resume resets the
session as an operator's reset does, and is kept (the link's use) for the session's timeline.
"""

from __future__ import annotations

import hashlib
import html
import secrets
from urllib.parse import quote

from aiohttp import web
from sqlalchemy import select

from proxy.detect.actions import Action
from proxy.server.guard import Guard
from proxy.store.models import Detection
from proxy.store.queries import shown

# The page is a form: it posts to itself only, runs no script, and is never framed.
HEADERS = {
    "Content-Security-Policy": "default-src 'none'; style-src 'self'; form-action 'self'; base-uri 'none'; "
                               "frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer", "Cache-Control": "no-store",
}


def confirmation(token: str) -> str:
    """The value the page's button sends back: shown by the page, not in the link."""
    return hashlib.sha256(f"resume\x00{token}".encode()).hexdigest()[:24]


def _page(status: int, title: str, body: str) -> web.Response:
    text = (f"<!doctype html><html lang=en><meta charset=utf-8><title>{html.escape(title)} · loopwarden</title>"
            f"<link rel=stylesheet href=/loopwarden/static/style.css><main class=resume><h1>{html.escape(title)}</h1>"
            f"{body}</main></html>")
    return web.Response(status=status, text=text, content_type="text/html", headers=HEADERS)


def routes(guard: Guard) -> list[web.RouteDef]:
    store = guard.store

    async def stop_of(link: dict) -> str:
        """The message of the stop the link answers (the latest of its task; the log is flushed by the lookup of
        the link before it)."""
        async with store.engine.connect() as connection:
            row = (await connection.execute(
                select(Detection).where(Detection.tenant == link["tenant"], Detection.session_id == link["session_id"],
                                        Detection.task == link["task"], Detection.action == Action.STOPPED)
                .order_by(Detection.id.desc()).limit(1))).first()
        return shown(row) if row is not None else ""

    async def show(request: web.Request) -> web.Response:
        token = request.match_info["token"]
        link = await store.resume_link(token)
        if link is None:
            return _page(404, "No such link", "<p>This resume link was never issued.</p>")
        session = html.escape(link["session_id"])
        if link["used_at"] is not None:
            return _page(410, "Already resumed", f"<p>Session <code>{session}</code> was resumed with this link "
                                                 f"already; a link lets a session go on once.</p>")
        stopped = html.escape(await stop_of(link))
        return _page(200, "Resume this session?",
                     f"<p>Session <code>{session}</code> was stopped:</p><blockquote>{stopped}</blockquote>"
                     f"<p>Resuming forgives its warnings and the stop: the agent's next request goes through, with "
                     f"its warnings counted afresh.</p><form method=post>"
                     f"<input type=hidden name=confirm value={confirmation(token)}>"
                     f"<button type=submit>Resume the session</button></form>")

    async def resume(request: web.Request) -> web.Response:
        token = request.match_info["token"]
        form = await request.post()
        if not secrets.compare_digest(str(form.get("confirm", "")), confirmation(token)):
            return _page(400, "Not resumed", "<p>Open the link and use its button to resume the session.</p>")
        link = await store.use_resume_link(token, guard.known_message_counts())
        if link is None:
            return await show(request)  # never issued (404), or spent already (410)
        session = html.escape(link["session_id"])
        return _page(200, "Resumed", f"<p>Session <code>{session}</code> goes on: its next request is forwarded, "
                                     f"with its warnings counted afresh.</p><h2>What happens next</h2><ul>"
                                     f"<li>An agent that ended its run when refused waits for you: give it its next "
                                     f"instruction (in Claude Code, type it at the prompt), ideally naming another "
                                     f"way to go about the task.</li>"
                                     f"<li>An agent still running goes on with its next request by itself.</li>"
                                     f"<li>If it falls into the same loop, it is warned again and then stopped again, "
                                     f"with a new link.</li></ul><p><a href=\"/loopwarden/#open="
                                     f"{html.escape(quote(link['session_id'], safe=''))}\">Follow the session on the "
                                     f"page</a></p>")

    return [web.get("/loopwarden/resume/{token}", show), web.post("/loopwarden/resume/{token}", resume)]

"""`/loopwarden/resume/<token>`: the person running an agent lets a stopped session go on.

A stop's message names a one-time link bound to its session and task (SPEC §4); it unlocks nothing else. GET
shows what will be resumed and resumes nothing; a button POSTs a value drawn for that showing of the page (kept
hashed, never derived from the link; a later showing replaces it), so a tool that only fetches the link resumes
nothing. The agent was
handed the link too, so the resume needs what the agent does not have: the ADMIN_TOKEN, where one is set; with
none, only a loopback client can resume, as only a loopback client can use the page (what that does not keep
out: an agent running on the proxy's own machine with a shell). Used once, the link is spent; unused, it
expires after RESUME_LINK_TTL hours. The resume resets the session as an operator's reset does, and is kept (the
link's use) for the session's timeline.
"""

from __future__ import annotations

import html
import secrets
from urllib.parse import quote

from aiohttp import web
from sqlalchemy import select

from proxy.detect.actions import Action
from proxy.server.admin import is_loopback
from proxy.server.guard import Guard
from proxy.store.models import Detection
from proxy.store.queries import shown

# The page is a form: it posts to itself only, runs no script, and is never framed.
HEADERS = {
    "Content-Security-Policy": "default-src 'none'; style-src 'self'; form-action 'self'; base-uri 'none'; "
                               "frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer", "Cache-Control": "no-store",
}


def _page(status: int, title: str, body: str) -> web.Response:
    text = (f"<!doctype html><html lang=en><meta charset=utf-8><title>{html.escape(title)} · loopwarden</title>"
            f"<link rel=stylesheet href=/loopwarden/static/style.css><main class=resume><h1>{html.escape(title)}</h1>"
            f"{body}</main></html>")
    return web.Response(status=status, text=text, content_type="text/html", headers=HEADERS)


def routes(guard: Guard) -> list[web.RouteDef]:
    store, admin_token = guard.store, guard.settings.admin_token

    async def stop_of(link: dict) -> str:
        """The message of the stop the link answers (the latest of its task; the log is flushed by the lookup of
        the link before it)."""
        async with store.engine.connect() as connection:
            row = (await connection.execute(
                select(Detection).where(Detection.tenant == link["tenant"], Detection.session_id == link["session_id"],
                                        Detection.task == link["task"], Detection.action == Action.STOPPED)
                .order_by(Detection.id.desc()).limit(1))).first()
        return shown(row) if row is not None else ""

    def unusable(link: dict | None) -> web.Response | None:
        """The page for a link that cannot be used (never issued, spent, expired); None for one that can."""
        if link is None:
            return _page(404, "No such link", "<p>This resume link was never issued.</p>")
        session = html.escape(link["session_id"])
        if link["used_at"] is not None:
            return _page(410, "Already resumed", f"<p>Session <code>{session}</code> was resumed with this link "
                                                 f"already; a link lets a session go on once.</p>")
        if link["expired"]:
            return _page(410, "Link expired", f"<p>This link to resume session <code>{session}</code> has expired. "
                                              f"An operator can still resume it from the page or with "
                                              f"<code>loopwarden resume</code>.</p>")
        return None

    async def show(request: web.Request) -> web.Response:
        token = request.match_info["token"]
        link = await store.resume_link(token)
        refused = unusable(link)
        if refused is not None:
            return refused
        stopped = html.escape(await stop_of(link))
        asked = ("<p><label>Admin token <input type=password name=admin_token autocomplete=current-password "
                 "required></label></p>") if admin_token else ""
        return _page(200, "Resume this session?",
                     f"<p>Session <code>{html.escape(link['session_id'])}</code> was stopped:</p>"
                     f"<blockquote>{stopped}</blockquote>"
                     f"<p>Resuming forgives its warnings and the stop: the agent's next request goes through, with "
                     f"its warnings counted afresh.</p><form method=post>"
                     f"<input type=hidden name=confirm value={await store.resume_confirmation(token)}>{asked}"
                     f"<button type=submit>Resume the session</button></form>")

    async def resume(request: web.Request) -> web.Response:
        token = request.match_info["token"]
        form = await request.post()
        if admin_token:
            if not secrets.compare_digest(str(form.get("admin_token", "")).encode(), admin_token.encode()):
                return _page(401, "Not resumed", "<p>Resuming needs the admin token: open the link and enter it "
                                                 "with the page's button.</p>")
        elif not is_loopback(request):
            return _page(403, "Not resumed", "<p>With no ADMIN_TOKEN set, a session is resumed only from the "
                                             "proxy's own machine.</p>")
        link = await store.use_resume_link(token, str(form.get("confirm", "")), guard.known_message_counts())
        if link is None:
            refused = unusable(await store.resume_link(token))  # never issued, spent (maybe just now), expired
            return refused or _page(400, "Not resumed", "<p>Open the link and use its button to resume the "
                                                        "session.</p>")
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

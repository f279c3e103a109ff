"""Session Manager sessions: ``StartSession`` / ``TerminateSession`` for port forwarding.

AWS: ``aws ssm start-session`` calls ``StartSession`` (target, document, parameters), which
answers a ``SessionId``, a ``TokenValue`` and a ``StreamUrl``; the AWS CLI then runs the
Session Manager plugin with that answer, the plugin opens the session's data channel, and
for ``AWS-StartPortForwardingSession`` the SSM Agent on the instance connects to
``localhost:<portNumber>`` there while the plugin listens on
``localhost:<localPortNumber>`` on the caller's machine
(https://docs.aws.amazon.com/systems-manager/latest/APIReference/API_StartSession.html,
https://docs.aws.amazon.com/systems-manager/latest/userguide/session-manager-working-with-sessions-start.html#sessions-start-port-forwarding).
A target whose agent is not connected is refused with ``TargetNotConnected``; a document
that is not a Session document with ``InvalidDocument``. moto 5.2 has no ``StartSession``.

Here, inside the emulator's moto server process:

- ``StartSession`` checks the target is an instance whose (emulated) SSM Agent announced
  itself and whose machine still runs (``emulator.ssm_agent``), else ``TargetNotConnected``;
  that the document is one of the Session documents the emulator plays (port forwarding;
  an interactive shell, ``SSM-SessionManagerRunShell``, is accepted by the API but the
  plugin stand-in does not play it); that ``portNumber`` and ``localPortNumber`` are ports.
  The session is recorded ``Connected`` with a random token; ``TerminateSession`` ends it.
- The data channel is moto's configuration API (``GET /moto-api/static/ssm/sessions/<id>``,
  beside the agents' announce route), which answers a session only to the holder of its
  token. The laptop's plugin is a stand-in (``emulator.session_plugin``), put on ``PATH``
  where a user would install AWS's plugin.

The differences from AWS are in docs/emulator.md.
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any

from emulator import ssm_agent

SESSIONS_PATH = "/moto-api/static/ssm/sessions"
PORT_FORWARDING = "AWS-StartPortForwardingSession"
SHELL = "SSM-SessionManagerRunShell"
#: the Session documents StartSession accepts here (AWS-owned; the account's own are not
#: played)
SESSION_DOCUMENTS = (PORT_FORWARDING, SHELL)

_LOCK = threading.Lock()
_SESSIONS: dict[str, Session] = {}
_INSTALLED = False


@dataclass
class Session:
    session_id: str
    token: str
    target: str
    document: str
    parameters: dict[str, list[str]]
    status: str = "Connected"
    started: float = 0.0


class SessionError(Exception):
    """An SSM error StartSession answers (code, message)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def start(target: str, document: str, parameters: dict[str, Any], *, region: str,
          agents: dict[str, Any] | None = None) -> Session:
    """Record a new session after SSM's checks (SessionError otherwise)."""
    agents = ssm_agent.agents() if agents is None else agents
    agent = agents.get(target)
    if agent is None or not agent.alive():
        raise SessionError("TargetNotConnected", f"{target} is not connected.")
    if document not in SESSION_DOCUMENTS:
        raise SessionError("InvalidDocument", f"Document {document} is not a Session "
                           "document this emulator plays")
    values = {str(k): [str(x) for x in (v if isinstance(v, list) else [v])]
              for k, v in (parameters or {}).items()}
    if document == PORT_FORWARDING:
        for name in ("portNumber", "localPortNumber"):
            given = values.get(name, [""])
            if len(given) != 1 or not given[0].isdigit() or not 1 <= int(given[0]) <= 65535:
                raise SessionError("InvalidParameters", f"{name} must be one port "
                                   f"1..65535, got {given}")
    session = Session(session_id=f"emulator-{secrets.token_hex(8)}",
                      token=secrets.token_urlsafe(24), target=target, document=document,
                      parameters=values, started=time.time())
    session.parameters.setdefault("region", [region])
    with _LOCK:
        _SESSIONS[session.session_id] = session
    return session


def terminate(session_id: str) -> None:
    with _LOCK:
        found = _SESSIONS.get(session_id)
        if found is not None:
            found.status = "Terminated"


def lookup(session_id: str, token: str) -> Session | None:
    """The session, for the holder of its token only (what the data channel checks)."""
    with _LOCK:
        found = _SESSIONS.get(session_id)
    if found is None or not secrets.compare_digest(found.token, token):
        return None
    return found


def reset() -> None:
    with _LOCK:
        _SESSIONS.clear()


# -- moto ------------------------------------------------------------------------------------


def _start_session(self: Any) -> Any:
    from moto.core.responses import ActionResult
    from moto.ssm.exceptions import SSMException

    try:
        session = start(self._get_param("Target"), self._get_param("DocumentName", SHELL),
                        self._get_param("Parameters") or {}, region=self.region)
    except SessionError as exc:
        raise SSMException(exc.code, str(exc)) from None
    return ActionResult({
        "SessionId": session.session_id, "TokenValue": session.token,
        "StreamUrl": f"{SESSIONS_PATH}/{session.session_id}"})


def _terminate_session(self: Any) -> Any:
    from moto.core.responses import ActionResult

    session_id = self._get_param("SessionId")
    terminate(session_id)
    return ActionResult({"SessionId": session_id})


def _sessions_view(request: Any, full_url: str, headers: Any) -> tuple[int, dict, str]:
    """``GET /moto-api/static/ssm/sessions/<id>`` with ``X-Session-Token``: the session."""
    session_id = full_url.split("?")[0].rstrip("/").rsplit("/", 1)[-1]
    token = request.headers.get("X-Session-Token", "") if request.headers else ""
    found = lookup(session_id, token)
    if found is None:
        return 403, {"Content-Type": "application/json"}, json.dumps(
            {"error": f"no session {session_id} for that token"})
    return 200, {"Content-Type": "application/json"}, json.dumps(asdict(found) | {"token": ""})


def install() -> None:
    """Add StartSession / TerminateSession and the data-channel route (before serving)."""
    global _INSTALLED
    if _INSTALLED:
        return
    from moto.moto_api._internal import urls as moto_api_urls
    from moto.ssm.responses import SimpleSystemManagerResponse

    moto_api_urls.url_paths["{0}" + SESSIONS_PATH + "/(?P<session_id>[^/]+)$"] = _sessions_view
    SimpleSystemManagerResponse.start_session = _start_session  # type: ignore[attr-defined]
    SimpleSystemManagerResponse.terminate_session = _terminate_session  # type: ignore[attr-defined]
    _INSTALLED = True

"""HTTP calls to a vLLM server (its OpenAI-compatible completions and its RL control routes: pause, resume, the
weight-transfer handshake), with the standard library only: the trainer's environment needs no vLLM to use a server.
Every call has a timeout, and a failure is one line naming the server and the route."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request


# requests go straight to the servers: an http_proxy of the environment is for the internet, not for them
OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class ServerCallError(RuntimeError):
    pass


def call(url: str, route: str, body: dict | None = None, *, timeout_s: float, query: dict | None = None) -> dict:
    """POST `body` (GET when None) to url/route; the JSON answer."""
    target = url.rstrip("/") + route + ("?" + urllib.parse.urlencode(query) if query else "")
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(target, data=data, method="GET" if body is None else "POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with OPENER.open(request, timeout=timeout_s) as response:
            text = response.read()
    except urllib.error.HTTPError as error:
        detail = error.read().decode(errors="replace").strip().splitlines()
        raise ServerCallError(f"vLLM server {url}: {route} answered {error.code}: "
                              f"{detail[-1][:300] if detail else error.reason}") from None
    except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as error:
        reason = getattr(error, "reason", error)
        raise ServerCallError(f"vLLM server {url}: {route} got no answer within {timeout_s:g} s ({reason})") from None
    return json.loads(text) if text else {}

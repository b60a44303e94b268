"""The job's events sent to a webhook from the batch host, with the standard library: an HTTP POST
of a small JSON body per event (``json``: event, job_id, run, text, time; ``slack``: its text;
``teams``: an Adaptive Card message).

Sending never holds the job up nor changes its exit code: each event is posted from a daemon thread
(after the one before it, so that they arrive in order) with a short timeout, every error is one
line in the job's log, and at the job's end the supervisor waits for the posts still under way at
most :data:`FINISH_S` in all (:meth:`Notifier.finish`).

The URL holds the webhook's token: it is a secret of the run, read from the job's environment (the
batch shell exported it from the secrets file) and never printed. An error is told by its kind only
(an HTTP status, "Connection refused", "timed out"), and that text is scrubbed of the URL's parts.

New code emits an event with ``Supervisor.notifier.send(kind, text)``: ``restart`` for a restart of
its own making, say.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import List, Mapping, Optional

from .plan import Notify

EVENTS = ("start", "failure", "hang", "restart", "completion")
POST_TIMEOUT_S = 5.0  # one event's connect and each read
FINISH_S = 5.0  # the most the job's end waits for the posts still under way, all together
HIDDEN = "<webhook>"


class Notifier:
    """Sends the plan's events for one job (``job_id``, in ``run``, the run directory) of ``name``."""

    def __init__(self, notify: Optional[Notify], environ: Mapping[str, str], name: str, job_id: str, run: str) -> None:
        self.notify, self.name, self.job_id, self.run = notify, name, job_id, run
        self.threads: List[threading.Thread] = []
        self.url: Optional[str] = None
        if notify is None:
            return
        url = environ.get(notify.webhook_env, "")
        if not url.lower().startswith(("http://", "https://")):
            what = "is not set" if not url else "does not hold an http:// or https:// URL"
            print(f"clusterkit: notify: ${notify.webhook_env} {what} in the job's environment: no webhook", flush=True)
            return
        self.url = url

    def send(self, event: str, text: str) -> None:
        """Post ``event`` (one of :data:`EVENTS`) with ``text``, one line, if the plan asks for it;
        returns at once."""
        if self.url is None or self.notify is None or event not in self.notify.events:
            return
        body = encode(self.notify.format, event, self.name, self.job_id, self.run, text, time.time())
        after = self.threads[-1] if self.threads else None
        thread = threading.Thread(target=self._post, args=(self.url, event, body, after), name=f"notify-{event}")
        thread.daemon = True  # the job's end never waits for it past finish()
        thread.start()
        self.threads.append(thread)

    def finish(self, bound_s: float = FINISH_S) -> None:
        """Wait for the posts under way, at most ``bound_s`` in all; the rest are left behind."""
        deadline = time.monotonic() + bound_s
        if self.threads:
            self.threads[-1].join(max(0.0, deadline - time.monotonic()))  # the last goes after the others
        left = sum(thread.is_alive() for thread in self.threads)
        if left:
            print(f"clusterkit: notify: {left} event(s) not sent within {bound_s:g} s: left behind", flush=True)
        self.threads = []

    def _post(self, url: str, event: str, body: bytes, after: Optional[threading.Thread]) -> None:
        if after is not None:
            after.join()
        try:
            request = urllib.request.Request(
                url, data=body, headers={"Content-Type": "application/json"}, method="POST"
            )
            with urllib.request.urlopen(request, timeout=POST_TIMEOUT_S) as response:
                response.read(4096)
        except Exception as exc:  # noqa: BLE001  every failure of the post: one line, and the job goes on
            print(f"clusterkit: notify: the {event} event was not sent: {scrub(describe(exc), url)}", flush=True)


def encode(form: str, event: str, name: str, job_id: str, run: str, text: str, when: float) -> bytes:
    line = f"clusterkit: {name} job {job_id}: {text}"
    if form == "slack":
        body: object = {"text": line}
    elif form == "teams":
        card = {
            "type": "AdaptiveCard",
            "$schema": "http://adaptivecards.io/schemas/adaptive-card.json",
            "version": "1.4",
            "body": [{"type": "TextBlock", "text": line, "wrap": True}],
        }
        body = {
            "type": "message",
            "attachments": [{"contentType": "application/vnd.microsoft.card.adaptive", "content": card}],
        }
    else:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(when))
        body = {"event": event, "job_id": job_id, "run": run, "text": line, "time": stamp}
    return json.dumps(body).encode()


def describe(exc: BaseException) -> str:
    """What went wrong, by its kind: an exception's message may hold the URL (an invalid one's does)."""
    if isinstance(exc, urllib.error.HTTPError):
        return f"HTTP {exc.code}"
    reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
    if isinstance(reason, OSError) and reason.strerror:
        return reason.strerror
    if isinstance(reason, TimeoutError) or "timed out" in str(reason):
        return f"timed out ({POST_TIMEOUT_S:g} s)"
    return type(reason).__name__ if isinstance(reason, BaseException) else str(reason)


def scrub(text: str, url: str) -> str:
    """``text`` without the URL or any part of it that could carry its token (as written, or
    %-decoded), whether or not it is a URL urllib can split."""
    words = {url, urllib.parse.unquote(url)}
    for whole in list(words):
        for separator in "/?&=#@:;[] ":
            whole = whole.replace(separator, "\n")
        words.update(word for word in whole.split("\n") if len(word) >= 4 and word.lower() not in ("http", "https"))
    for word in sorted(words, key=len, reverse=True):
        text = text.replace(word, HIDDEN)
    return text

"""``notify:``: the job's events sent to people: a webhook the job posts to from the batch host
(a chat's incoming webhook, or any HTTP endpoint), and/or SLURM's own e-mail (``--mail-type``,
``--mail-user``) for clusters whose compute nodes cannot reach the network.

The webhook's URL holds its token, so it is a secret: the recipe names the secret that holds it
(``webhook_secret``), never the URL; the name joins ``secrets:`` if it is not there already, and its
value travels as every secret's does (spec.secrets). The user config may give a ``notify:`` that
applies to every recipe without one of its own (``notify: null`` in a recipe turns it off).
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from clusterkit.spec.text import END

# What happened to the job (clusterkit.supervisor.notify sends them): start (the launch step
# starts), failure (the job ends non-zero), hang (the watchdog found no progress), restart (a
# requeue, or a retry as a new job), completion (the job ends with 0).
NotifyEvent = Literal["start", "failure", "hang", "restart", "completion"]
NOTIFY_EVENTS: tuple[str, ...] = NotifyEvent.__args__  # type: ignore[attr-defined]
# SLURM's --mail-type for each event it can mail about itself (END: every end, a failure's too).
MAIL_TYPES = {"start": "BEGIN", "failure": "FAIL", "restart": "REQUEUE", "completion": "END"}
# One address (or a user name the site's mail delivers to): no space, comma, quote or shell character.
EMAIL_PATTERN = rf"^[A-Za-z0-9_][A-Za-z0-9._%+-]*(@[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)*)?{END}"
EMAIL_HINT = "one e-mail address such as me@example.org (letters, digits and . _ % + - before the @)"
ENV_NAME_PATTERN = f"^[A-Za-z_][A-Za-z0-9_]*{END}"
NOTIFY_PATTERN_HINTS = {EMAIL_PATTERN: EMAIL_HINT}


class Notify(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, omit_defaults=False):
    # The secret whose value is the webhook's URL (http or https), e.g. SLACK_WEBHOOK: set it in the
    # environment you submit from, or in your secrets_file; it is added to secrets: where missing.
    webhook_secret: Annotated[str, Meta(pattern=ENV_NAME_PATTERN)] | None = None
    # The webhook's body: json ({"event", "job_id", "run", "text", "time"}), slack ({"text"}: Slack's,
    # Mattermost's, Rocket.Chat's incoming webhooks), teams (an Adaptive Card message: a Teams
    # workflow's "when a webhook request is received").
    format: Literal["json", "slack", "teams"] = "json"
    # SLURM mails this address (#SBATCH --mail-user) for the events it knows: start, failure,
    # restart and completion (--mail-type BEGIN, FAIL, REQUEUE, END); a hang mails as its failure.
    email: Annotated[str, Meta(pattern=EMAIL_PATTERN)] | None = None
    events: list[NotifyEvent] = msgspec.field(default_factory=lambda: ["failure", "hang", "restart", "completion"])


def notify_secrets(secrets: list[str], notify: Notify | None) -> list[str]:
    """The recipe's secrets, with the webhook's where ``secrets:`` does not name it."""
    if notify is None or notify.webhook_secret is None or notify.webhook_secret in secrets:
        return list(secrets)
    return [*secrets, notify.webhook_secret]


def mail_type(notify: Notify | None) -> str | None:
    """``--mail-type``: the events SLURM mails about, or None (no e-mail, or none it can send)."""
    if notify is None or notify.email is None:
        return None
    types = [MAIL_TYPES[event] for event in NOTIFY_EVENTS if event in notify.events and event in MAIL_TYPES]
    return ",".join(types) or None

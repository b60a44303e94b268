"""Notifications: the supervisor, in-process against the fake job environment, posts its events to a
real HTTP server on 127.0.0.1; a webhook that refuses or never answers neither delays the job past
the bound nor changes its exit code, and the URL (a secret: it holds the token) is never printed.
The recipe side: notify: validated in one line, the webhook's secret added to secrets:, the
user config's default, SLURM's e-mail in the #SBATCH header, and the URL in no rendered file."""

from __future__ import annotations

import http.server
import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from clusterkit.load.loader import load_recipe
from clusterkit.render.job import render_job
from clusterkit.spec.sbatch_header import header_options
from clusterkit.supervisor import notify
from clusterkit.supervisor.plan import Notify, Recovery, Watchdog, load_plan
from clusterkit.supervisor.watchdog import EXIT_HUNG
from conftest import run_cli
from test_stacks import HANGING, DumpingJob
from test_supervisor import FakeJob, _plan, _supervise

TOKEN = "T0AAA/B0BBB/xoxb-MARK-token-77"
EVERY = ("start", "failure", "hang", "restart", "completion")


class Hook:
    """An HTTP server on 127.0.0.1 that records every POST (``answer``: how it answers)."""

    def __init__(self, status: int = 200) -> None:
        received = self.received = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", 0))
                received.append((self.path, self.headers.get("Content-Type"), json.loads(self.rfile.read(length))))
                self.send_response(status)
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/services/{TOKEN}?key=MARK-query"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def events(self) -> list[str]:
        return [body["event"] for _, _, body in self.received]


@pytest.fixture
def hook() -> Iterator[Hook]:
    server = Hook()
    yield server
    server.server.shutdown()


@pytest.fixture
def silent() -> Iterator[str]:
    """A webhook that accepts the connection and never answers."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    held = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except OSError:
                continue

    threading.Thread(target=accept, daemon=True).start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}/hooks/{TOKEN}"
    stop.set()
    for connection in held:
        connection.close()
    listener.close()


def _closed_port_url() -> str:
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()  # nothing listens there now: connections are refused
    return f"http://127.0.0.1:{port}/hooks/{TOKEN}"


def _job(url: str, behaviour: dict[str, str] | None = None) -> FakeJob:
    return FakeJob(behaviour or {}, {"SLACK_WEBHOOK": url})


def _notify(events=EVERY, form: str = "json") -> Notify:
    return Notify(webhook_env="SLACK_WEBHOOK", events=tuple(events), format=form)


def _wait_for(hook: Hook, count: int) -> None:
    deadline = time.monotonic() + 5
    while len(hook.received) < count and time.monotonic() < deadline:
        time.sleep(0.05)


def test_a_good_run_posts_its_start_and_completion(tmp_path: Path, hook: Hook, capsys) -> None:
    code, run_dir = _supervise(tmp_path, _plan(notify=_notify()), _job(hook.url))
    assert code == 0
    assert hook.events() == ["start", "completion"]  # finish() waited for them
    (path, kind, start), (_, _, completion) = hook.received
    assert path == f"/services/{TOKEN}?key=MARK-query" and kind == "application/json"
    assert set(start) == {"event", "job_id", "run", "text", "time"}
    assert start["job_id"] == "4242" and start["run"] == str(run_dir)
    assert start["text"] == "clusterkit: t job 4242: started on n1 n2"
    assert completion["text"] == "clusterkit: t job 4242: completed (exit code 0)"
    assert time.strptime(completion["time"], "%Y-%m-%dT%H:%M:%SZ")
    assert "MARK-" not in capsys.readouterr().out


def test_a_failing_run_posts_its_start_and_failure_and_only_the_events_asked_for(tmp_path: Path, hook: Hook) -> None:
    code, _ = _supervise(tmp_path, _plan(notify=_notify()), _job(hook.url, {"launch": "exit 3"}))
    assert code == 3 and hook.events() == ["start", "failure"]
    assert hook.received[1][2]["text"].endswith("failed with exit code 3")
    hook.received.clear()
    code, _ = _supervise(tmp_path, _plan(notify=_notify(["failure"])), _job(hook.url))
    assert code == 0 and hook.received == []


def test_a_retried_failure_posts_the_failure_and_the_restart(tmp_path: Path, hook: Hook) -> None:
    plan = _plan(notify=_notify(), recovery=Recovery(signal="USR2", max_requeues=0, max_retries=2))
    code, _ = _supervise(tmp_path, plan, _job(hook.url, {"launch": "exit 1"}))
    assert code == 1 and hook.events() == ["start", "failure", "restart"]
    assert hook.received[2][2]["text"].endswith("retry 1 of 2: job 5000")


def test_a_requeue_after_preemption_posts_a_restart_and_no_outcome(tmp_path: Path, hook: Hook) -> None:
    run_dir = tmp_path / "run"
    launch = f"echo '{{\"step\": 7}}' > {run_dir}/preempted.json"
    code, _ = _supervise(tmp_path, _plan(notify=_notify()), _job(hook.url, {"launch": launch}))
    assert code == 0 and hook.events() == ["start", "restart"]
    assert hook.received[1][2]["text"].endswith("preempted at step 7: requeued (restart 1 of at most 2)")


def test_a_hang_posts_the_watchdogs_one_line_summary(tmp_path: Path, hook: Hook) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "ranks").mkdir()
    job = DumpingJob({"launch": "sleep 30"}, HANGING, run_dir)
    job.environ["SLACK_WEBHOOK"] = hook.url
    plan = _plan(notify=_notify(), watchdog=Watchdog(no_progress_s=60, startup_s=1, action="fail"))
    code, _ = _supervise(tmp_path, plan, job)
    assert code == EXIT_HUNG and hook.events() == ["start", "hang", "failure"]
    hang = hook.received[1][2]["text"]
    assert hang == (
        "clusterkit: t job 4242: HUNG: no first step for 1 s (watchdog.startup: 1 s): 3 of 4 ranks are in "
        "all_reduce at data.py:40; rank 2 on n2 is in next_batch at data.py:40 (watchdog.action: fail)"
    )
    assert hook.received[2][2]["text"].endswith(f"failed with exit code {EXIT_HUNG} (hung: ended by the watchdog)")


@pytest.mark.parametrize("where", ["closed port", "never answers", "HTTP 500"])
def test_an_unreachable_webhook_neither_delays_the_job_nor_changes_its_code_nor_shows_the_url(
    tmp_path: Path, silent: str, capsys, where: str
) -> None:
    server = Hook(status=500)
    url = {"closed port": _closed_port_url(), "never answers": silent, "HTTP 500": server.url}[where]
    started = time.monotonic()
    code, _ = _supervise(tmp_path, _plan(notify=_notify()), _job(url, {"launch": "exit 4"}))
    took = time.monotonic() - started
    server.server.shutdown()
    out = capsys.readouterr().out
    assert code == 4
    # Both posts run at once; the job's end waits FINISH_S at most for those still under way.
    assert took < notify.FINISH_S + 3, took
    lines = [line for line in out.splitlines() if "notify" in line]
    assert lines, out
    expected = {
        "closed port": "Connection refused",
        "never answers": "left behind",
        "HTTP 500": "HTTP 500",
    }[where]
    assert any(expected in line for line in lines), lines
    assert "MARK-" not in out and "127.0.0.1" not in out and TOKEN not in out


@pytest.mark.parametrize(
    "url, said",
    [
        ("", "$SLACK_WEBHOOK is not set"),
        (f"hooks.example/{TOKEN}", "$SLACK_WEBHOOK does not hold an http:// or https:// URL"),
        (f"ftp://x/{TOKEN}", "$SLACK_WEBHOOK does not hold an http:// or https:// URL"),
    ],
)
def test_a_missing_or_odd_url_is_one_line_naming_the_secret_never_its_value(tmp_path, capsys, url, said) -> None:
    job = _job(url) if url else FakeJob({})
    code, _ = _supervise(tmp_path, _plan(notify=_notify()), job)
    out = capsys.readouterr().out
    assert code == 0 and f"clusterkit: notify: {said} in the job's environment: no webhook\n" in out
    assert "MARK-" not in out


@pytest.mark.parametrize(
    "url",
    [
        f"http://127.0.0.1:1/{TOKEN} space",  # http.client refuses it, naming the URL
        f"http://[::1/{TOKEN}",  # not a URL urllib can split
        f"http://no-such-host.invalid/{TOKEN}",
    ],
)
def test_error_messages_that_would_quote_the_url_are_scrubbed(tmp_path: Path, capsys, url: str) -> None:
    code, _ = _supervise(tmp_path, _plan(notify=_notify(["completion"])), _job(url))
    out, err = capsys.readouterr()
    assert code == 0 and "clusterkit: notify: the completion event was not sent: " in out, out
    assert "MARK-" not in out + err, out + err


def test_scrub_removes_the_url_and_its_parts() -> None:
    url = f"https://hooks.slack.com/services/{TOKEN}?sig=MARK-sig"
    text = f"bad {url}; path /services/{TOKEN}; token xoxb-MARK-token-77 and MARK-sig"
    assert "MARK-" not in notify.scrub(text, url)


def test_slack_and_teams_bodies(tmp_path: Path, hook: Hook) -> None:
    _supervise(tmp_path, _plan(notify=_notify(["completion"], "slack")), _job(hook.url))
    _supervise(tmp_path, _plan(notify=_notify(["completion"], "teams")), _job(hook.url))
    (_, _, slack), (_, _, teams) = hook.received
    assert slack == {"text": "clusterkit: t job 4242: completed (exit code 0)"}
    assert teams["type"] == "message"
    (attachment,) = teams["attachments"]
    assert attachment["contentType"] == "application/vnd.microsoft.card.adaptive"
    assert attachment["content"]["body"] == [
        {"type": "TextBlock", "text": "clusterkit: t job 4242: completed (exit code 0)", "wrap": True}
    ]


def test_new_code_can_emit_a_restart_of_its_own(hook: Hook) -> None:
    notifier = notify.Notifier(_notify(["restart"]), {"SLACK_WEBHOOK": hook.url}, "t", "9", "/runs/t/9")
    notifier.send("restart", "restarted on spare node n9")
    notifier.finish()
    assert hook.received[0][2]["text"] == "clusterkit: t job 9: restarted on spare node n9"


def test_the_plan_reads_its_notify_back() -> None:
    plan = _plan(notify=_notify(["hang"], "slack"))
    assert load_plan(plan.to_json()) == plan
    assert '"webhook_env": "SLACK_WEBHOOK"' in plan.to_json()


# The recipe side.

URL = f"https://hooks.example.org/services/{TOKEN}"


def _recipe(directory: Path, text: str, name: str = "r.yaml") -> Path:
    path = directory / name
    path.write_text(f'name: r\nresources: {{time: "5"}}\ntask: {{script: /bin/true}}\n{text}')
    return path


@pytest.fixture
def no_config(tmp_path: Path, monkeypatch) -> Path:
    """A user config of the test's own (empty until it writes one)."""
    monkeypatch.delenv("CLUSTERKIT_CONFIG", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    return tmp_path / "xdg" / "clusterkit" / "config.yaml"


def _mail(path: Path) -> dict:
    options = dict(header_options(load_recipe(path).recipe, load_recipe(path).profile))
    return {flag: options.get(flag) for flag in ("mail-type", "mail-user")}


def test_the_url_is_in_no_rendered_file_and_the_secret_joins_secrets(tmp_path: Path, no_config, monkeypatch) -> None:
    monkeypatch.setenv("SLACK_WEBHOOK", URL)
    path = _recipe(
        tmp_path,
        "secrets: [HF_TOKEN]\n"
        "notify: {webhook_secret: SLACK_WEBHOOK, format: slack, email: me@example.org, events: [start, hang, failure]}\n",
    )
    loaded = load_recipe(path)
    assert loaded.recipe.secrets == ["HF_TOKEN", "SLACK_WEBHOOK"]
    files = render_job(loaded).files
    assert not [name for name, text in files.items() if "MARK-" in text or "hooks.example.org" in text]
    plan = load_plan(files["plan.json"])
    assert plan.notify == Notify(webhook_env="SLACK_WEBHOOK", events=("start", "hang", "failure"), format="slack")
    assert plan.secrets == ("HF_TOKEN", "SLACK_WEBHOOK")  # kept out of a retry's sbatch environment
    assert "#SBATCH --mail-type=BEGIN,FAIL\n#SBATCH --mail-user=me@example.org\n" in files["job.sbatch"]
    assert "SLACK_WEBHOOK" in files["job.sbatch"]  # named where the secrets file is read, never valued
    assert yaml.safe_load(files["recipe.resolved.yaml"])["secrets"] == ["HF_TOKEN", "SLACK_WEBHOOK"]


def test_email_alone_is_slurms_mail_and_no_webhook_in_the_plan(tmp_path: Path, no_config) -> None:
    path = _recipe(tmp_path, "notify: {email: me@example.org, events: [failure, completion, restart, hang]}\n")
    assert _mail(path) == {"mail-type": "FAIL,REQUEUE,END", "mail-user": "me@example.org"}
    loaded = load_recipe(path)
    assert load_plan(render_job(loaded).files["plan.json"]).notify is None and loaded.recipe.secrets == []
    hang_only = _recipe(tmp_path, "notify: {email: me, events: [hang]}\n", "hang.yaml")
    assert _mail(hang_only) == {"mail-type": None, "mail-user": None}
    assert "notify.events: SLURM mails none of these events" in str(load_recipe(hang_only).warnings[0])


def test_extra_sbatch_mail_options_still_work_without_notify_email(tmp_path: Path, no_config) -> None:
    path = _recipe(tmp_path, "notify: {webhook_secret: HOOK, events: [hang]}\n")
    path.write_text(path.read_text().replace('time: "5"', 'time: "5", extra_sbatch: {mail-type: END, mail-user: a@b}'))
    assert _mail(path) == {"mail-type": "END", "mail-user": "a@b"}


def test_the_user_configs_notify_applies_unless_the_recipe_has_its_own_or_null(tmp_path: Path, no_config) -> None:
    no_config.parent.mkdir(parents=True)
    no_config.write_text("notify:\n  email: team@example.org\n  events: [failure]\n")
    assert _mail(_recipe(tmp_path, "")) == {"mail-type": "FAIL", "mail-user": "team@example.org"}
    own = _recipe(tmp_path, "notify: {email: me@example.org}\n", "own.yaml")
    assert _mail(own) == {"mail-type": "FAIL,REQUEUE,END", "mail-user": "me@example.org"}
    off = _recipe(tmp_path, "notify: null\n", "off.yaml")
    assert _mail(off) == {"mail-type": None, "mail-user": None}


def _refused(recipe: Path, env: dict[str, str]) -> str:
    done = run_cli("render", str(recipe), "-o", str(recipe.parent / "out"), env=env)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert not (recipe.parent / "out").exists()
    (line,) = [line for line in done.stderr.splitlines() if ": warning: " not in line]
    return line


@pytest.mark.parametrize(
    "notify, key, said",
    [
        ("{email: me@x.org, events: [start, crash]}", "notify.events[1]", "valid: start, failure, hang,"),
        ("{email: 'me@x.org;touch /tmp/p'}", "notify.email", "one e-mail address"),
        ("{email: 'me@x.org\\n#SBATCH --uid=0'}", "notify.email", "one e-mail address"),
        ("{email: 'a b@x.org'}", "notify.email", "one e-mail address"),
        ("{email: '-me@x.org'}", "notify.email", "one e-mail address"),
        ("{events: [failure]}", "notify", "nowhere to send the events"),
        ("{email: me@x.org, events: []}", "notify.events", "no events"),
        ("{email: me@x.org, events: [failure, failure]}", "notify.events[1]", "failure is named twice"),
        ("{webhook_secret: BASH_ENV}", "notify.webhook_secret", "BASH_ENV names a file"),
        ("{webhook_secret: SLURM_HOOK}", "notify.webhook_secret", "is set by SLURM"),
        ("{webhook_secret: 'https://hooks.example.org/x'}", "notify.webhook_secret", "letters, digits and '_'"),
    ],
)
def test_a_bad_notify_is_one_line_naming_its_key(tmp_path: Path, notify: str, key: str, said: str) -> None:
    env = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path / "xdg")}
    env.pop("CLUSTERKIT_CONFIG", None)
    line = _refused(_recipe(tmp_path, f"notify: {notify}\n"), env)
    assert line.startswith(f"{tmp_path / 'r.yaml'}:4: {key}: "), line
    assert said in line and "touch" not in line


def test_extra_sbatch_mail_options_beside_notify_email_are_refused(tmp_path: Path) -> None:
    path = _recipe(tmp_path, "notify: {email: me@x.org}\n")
    path.write_text(path.read_text().replace('time: "5"', 'time: "5", extra_sbatch: {mail-type: ALL}'))
    line = _refused(path, {**os.environ, "XDG_CONFIG_HOME": str(tmp_path / "xdg")})
    assert line == (
        f"{path}:2: resources.extra_sbatch.mail-type: --mail-type is written from notify.email and "
        "notify.events; remove it here or remove notify.email"
    )


def test_a_bad_notify_in_the_user_config_names_the_configs_line(tmp_path: Path) -> None:
    config = tmp_path / "xdg" / "clusterkit" / "config.yaml"
    config.parent.mkdir(parents=True)
    config.write_text("runs_dir: runs\nnotify:\n  email: me@x.org\n  events: [boom]\n")
    line = _refused(_recipe(tmp_path, ""), {**os.environ, "XDG_CONFIG_HOME": str(tmp_path / "xdg")})
    assert line.startswith(f"{config}:4: notify.events[0]: "), line

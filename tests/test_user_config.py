"""The user config (~/.config/clusterkit/config.yaml or $CLUSTERKIT_CONFIG): its defaults reach
recipes, profiles and the run commands in the documented order (flags > env > recipe > user config
> profile > defaults), `clusterkit config` says where each value came from, and a bad file is one
`file:line: key: message` error (exit 2), never a traceback. Real CLI processes throughout."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import yaml

from conftest import RECIPES, run_cli


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {
        name: value for name, value in os.environ.items() if name not in ("CLUSTERKIT_CONFIG", "CLUSTERKIT_CLUSTERS")
    }
    return {**env, "XDG_CONFIG_HOME": str(tmp_path / "xdg"), **extra}


def _config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "xdg" / "clusterkit" / "config.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _profile(directory: Path, name: str, **fields) -> Path:
    """The shipped dev profile under another name (and with ``fields`` changed)."""
    data = {**yaml.safe_load((RECIPES / "clusters" / "dev.yaml").read_text()), "name": name, **fields}
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _recipe(tmp_path: Path, **fields) -> Path:
    path = tmp_path / "r.yaml"
    path.write_text(
        yaml.safe_dump({"name": "r", "resources": {"time": "5"}, "task": {"script": "/bin/true"}, **fields})
    )
    return path


def _settings(done) -> dict[str, dict]:
    assert done.returncode == 0, done.stderr
    found: dict[str, dict] = {}
    for setting in json.loads(done.stdout):
        found.setdefault(setting["key"], setting)
    return found


def test_no_config_file_is_normal(tmp_path: Path) -> None:
    done = run_cli("config", "--json", env=_env(tmp_path), cwd=tmp_path)
    found = _settings(done)
    assert found["config_file"]["value"] == str(tmp_path / "xdg" / "clusterkit" / "config.yaml")
    assert (found["cluster"]["value"], found["cluster"]["source"]) == ("dev", "default")
    assert (found["runs_dir"]["value"], found["runs_dir"]["source"]) == ("./runs", "default")
    assert found["ssh.transport"] == {
        "key": "ssh.transport",
        "value": None,
        "source": "default",
        "where": "the profile's login:, else clusterkit's",
    }
    assert done.stderr == ""


# Odd but legal directory names: a space, ~, %, a leading '-'.
ODD_DIR = "my profiles ~%/-x"


def test_the_config_cluster_and_profile_dirs_reach_a_recipe_that_names_none(tmp_path: Path) -> None:
    _profile(tmp_path / ODD_DIR, "mine", runs_dir=str(tmp_path / "profile-runs"))
    # profile_dirs relative to the config file's directory
    config = _config(tmp_path, f"cluster: mine\nprofile_dirs: ['../../{ODD_DIR}']\n")
    recipe = _recipe(tmp_path)
    done = run_cli("render", str(recipe), "-o", str(tmp_path / "out"), env=_env(tmp_path), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    resolved = yaml.safe_load((tmp_path / "out" / "recipe.resolved.yaml").read_text())
    assert resolved["cluster"] == "mine" and resolved["runs_dir"] == str(tmp_path / "profile-runs")
    found = _settings(run_cli("config", str(recipe), "--json", env=_env(tmp_path), cwd=tmp_path))
    assert (found["cluster"]["source"], found["cluster"]["where"]) == ("user config", f"{config}:1")
    assert found["runs_dir"]["source"] == "profile"
    dirs = [s for s in json.loads(run_cli("config", "--json", env=_env(tmp_path)).stdout) if s["key"] == "profile_dirs"]
    assert [(Path(d["value"]).resolve(), d["source"]) for d in dirs][1] == (
        (tmp_path / ODD_DIR).resolve(),
        "user config",
    )


def test_precedence_flag_over_recipe_over_user_config_over_profile(tmp_path: Path) -> None:
    _profile(tmp_path / "profiles", "mine", runs_dir="from-profile")
    _profile(tmp_path / "profiles", "other")
    _config(tmp_path, f"cluster: mine\nprofile_dirs: [{tmp_path / 'profiles'}]\nruns_dir: from-config\n")
    env = _env(tmp_path)
    # user config over profile
    found = _settings(run_cli("config", str(_recipe(tmp_path)), "--json", env=env))
    assert (found["runs_dir"]["value"], found["runs_dir"]["source"]) == ("from-config", "user config")
    # recipe over user config
    found = _settings(
        run_cli("config", str(_recipe(tmp_path, cluster="other", runs_dir="from-recipe")), "--json", env=env)
    )
    assert (found["cluster"]["value"], found["cluster"]["source"]) == ("other", "recipe")
    assert (found["runs_dir"]["value"], found["runs_dir"]["source"]) == ("from-recipe", "recipe")
    # flags over recipe
    found = _settings(
        run_cli(
            "config",
            str(_recipe(tmp_path, cluster="other")),
            "--cluster",
            "dev",
            "--set",
            "runs_dir=from-flag",
            "--json",
            env=env,
        )
    )
    assert (found["cluster"]["value"], found["cluster"]["source"], found["cluster"]["where"]) == (
        "dev",
        "flag",
        "--cluster",
    )
    assert (found["runs_dir"]["value"], found["runs_dir"]["source"]) == ("from-flag", "flag")
    # env ($CLUSTERKIT_CLUSTERS) over the user config's profile_dirs: the first match wins
    _profile(tmp_path / "env-profiles", "mine", runs_dir="from-env-profile")
    found = _settings(
        run_cli(
            "config",
            str(_recipe(tmp_path)),
            "--json",
            env={**env, "CLUSTERKIT_CLUSTERS": str(tmp_path / "env-profiles"), "XDG_CONFIG_HOME": "/nonexistent"},
        )
    )
    assert found["profile_dirs"]["source"] == "env" and found["cluster"]["value"] == "dev"


def test_clusterkit_config_names_another_file(tmp_path: Path) -> None:
    other = tmp_path / "elsewhere.yaml"
    other.write_text("runs_dir: /scratch/x\nssh: {transport: paramiko, control_persist: 600}\n")
    found = _settings(run_cli("config", "--json", env=_env(tmp_path, CLUSTERKIT_CONFIG=str(other))))
    assert (found["config_file"]["value"], found["config_file"]["source"]) == (str(other), "env")
    assert found["runs_dir"]["value"] == "/scratch/x"
    assert (found["ssh.transport"]["value"], found["ssh.transport"]["where"]) == ("paramiko", f"{other}:2")
    assert found["ssh.control_persist"]["value"] == "600"
    assert (
        run_cli(
            "config", "--runs-dir", "mine", "--json", env=_env(tmp_path, CLUSTERKIT_CONFIG=str(other))
        ).stdout.count('"flag"')
        == 1
    )
    text = run_cli("config", env=_env(tmp_path, CLUSTERKIT_CONFIG=str(other))).stdout
    assert text.startswith("SETTING") and f"user config ({other}:1)" in text


def test_the_run_commands_look_in_the_config_runs_dir_unless_a_flag_says(tmp_path: Path) -> None:
    runs = tmp_path / "my runs"
    runs.mkdir()
    _config(tmp_path, yaml.safe_dump({"runs_dir": str(runs)}))
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    done = run_cli("ls", env=_env(tmp_path), cwd=elsewhere)
    assert done.returncode == 0 and done.stdout.strip() == f"no runs under {runs}", done.stdout
    done = run_cli("ls", "--runs-dir", str(elsewhere), env=_env(tmp_path), cwd=elsewhere)
    assert done.stdout.strip() == f"no runs under {elsewhere}", done.stdout


BAD_CONFIGS = {
    "unknown key": ("cluster: dev\nclustr: x\n", ":2: clustr: unknown key 'clustr'; did you mean 'cluster'?"),
    "unknown ssh key": ("ssh:\n  transprt: openssh\n", ":2: ssh.transprt: unknown key 'transprt'"),
    "wrong type": ("profile_dirs: /one/dir\n", ":1: profile_dirs: Expected `array`, got `str`"),
    "bad transport": ("ssh: {transport: telnet}\n", ":1: ssh.transport: Invalid enum value 'telnet'"),
    "bad control_persist": ("ssh: {control_persist: 'ten minutes'}\n", ":1: ssh.control_persist: "),
    "newline in a value": ('runs_dir: "a\\nb"\n', ":1: runs_dir: must be a non-empty single line"),
    "not a mapping": ("- a\n- b\n", ":1: <top level>: the user config must be a mapping"),
    "invalid yaml": ("cluster: [dev\n", ": <top level>: invalid YAML"),
    "duplicate key": ("cluster: a\ncluster: b\n", ":2: cluster: duplicate key"),
    "bad runs_dir for sbatch": ("runs_dir: '-runs'\n", ":1: runs_dir: a path starting with '-'"),
}


@pytest.mark.parametrize("case", sorted(BAD_CONFIGS))
def test_a_bad_config_is_one_line_naming_file_line_and_key(tmp_path: Path, case: str) -> None:
    text, expected = BAD_CONFIGS[case]
    config = _config(tmp_path, text)
    for command in (["config"], ["validate", str(_recipe(tmp_path))], ["ls"]):
        done = run_cli(*command, env=_env(tmp_path), cwd=tmp_path)
        if case == "bad runs_dir for sbatch" and command != ["validate", str(_recipe(tmp_path))]:
            continue  # the runs_dir is only checked as a recipe's
        assert done.returncode == 2, (command, done.stdout, done.stderr)
        lines = done.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith(str(config)) and expected in lines[0], (command, lines)
        assert "Traceback" not in done.stderr


def test_help_and_a_missing_named_config(tmp_path: Path) -> None:
    _config(tmp_path, "clustr: broken\n")
    for command in (["--help"], ["config", "--help"], ["submit", "--help"]):
        done = run_cli(*command, env=_env(tmp_path))
        assert done.returncode == 0 and done.stderr == "", command  # --help never reads the config
    assert "flags > environment > recipe > user config > cluster profile" in run_cli("config", "--help").stdout
    missing = tmp_path / "no such.yaml"
    done = run_cli("config", env=_env(tmp_path, CLUSTERKIT_CONFIG=str(missing)))
    assert (
        done.returncode == 2
        and done.stderr.strip() == f"{missing}: <top level>: file not found ($CLUSTERKIT_CONFIG names it)"
    )


def test_an_empty_or_unreadable_config(tmp_path: Path) -> None:
    _config(tmp_path, "# nothing set yet\n")
    assert _settings(run_cli("config", "--json", env=_env(tmp_path)))["cluster"]["source"] == "default"
    config = _config(tmp_path, "")
    config.unlink()
    config.mkdir()  # a directory where the file should be
    done = run_cli("config", env=_env(tmp_path))
    assert done.returncode == 2 and done.stderr == f"{config}: <top level>: not a regular file\n", done.stderr
    shutil.rmtree(config)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("", {}),
        ("ssh: {transport: openssh}\n", {"transport": "openssh"}),
        ("ssh: {control_persist: yes}\n", {"control_persist": True}),  # YAML 1.1's yes: ssh's own word too
        ("ssh: {control_persist: 1h30m, transport: auto}\n", {"control_persist": "1h30m", "transport": "auto"}),
        ("ssh: {control_persist: 0}\n", {"control_persist": 0}),
    ],
)
def test_ssh_settings_are_what_the_file_sets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, expected: dict
) -> None:
    from clusterkit.load.user_config import load_user_config

    config = tmp_path / "c.yaml"
    config.write_text(text)
    monkeypatch.setenv("CLUSTERKIT_CONFIG", str(config))
    assert load_user_config().ssh_settings() == expected


def test_the_user_configs_ssh_section_reaches_the_ssh_adapter_over_the_profile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a profile's login: says, unless this machine's config says otherwise; the options reach
    ssh as it reads them (yes/no from YAML booleans, a number of seconds)."""
    from clusterkit.schedulers import ssh
    from clusterkit.schedulers.openssh_transport import ssh_argv
    from clusterkit.spec.profile import Login, control_persist_option

    config = tmp_path / "c.yaml"
    config.write_text("ssh: {transport: paramiko, control_persist: no}\n")
    monkeypatch.setenv("CLUSTERKIT_CONFIG", str(config))
    with ssh.open_scheduler(Login(host="login.example", transport="openssh", control_persist="1h")) as scheduler:
        assert (scheduler.login.transport, scheduler.login.control_persist) == ("paramiko", False)
    config.write_text("")
    with ssh.open_scheduler(Login(host="login.example", transport="openssh", control_persist="1h")) as scheduler:
        assert (scheduler.login.transport, scheduler.login.control_persist) == ("openssh", "1h")
    assert [control_persist_option(v) for v in (False, True, 0, 600, "10m")] == ["no", "yes", "0", "600", "10m"]
    off = " ".join(ssh_argv(Login(host="h", control_persist=False), False, False, tmp_path))
    assert "ControlMaster=no" in off and "ControlPath=none" in off
    assert "ControlPersist=600" in " ".join(ssh_argv(Login(host="h", control_persist=600), False, False, tmp_path))

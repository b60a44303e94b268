"""`clusterkit profile init`: a cluster profile written from what SLURM says, in-process against a fake
Host fed the dev cluster's real output (tests/fixtures/slurm_site: scontrol show partition/node/config,
sbatch --help and srun --help of SLURM 22.05.8) and constructed clusters (typed GRES, InfiniBand
features, no GPUs, several partitions, hostile names); the written YAML always loads back to the
values drafted, nothing is ever replaced, and a bad NAME stops before the cluster is asked."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Sequence
from pathlib import Path

import msgspec
import pytest
import yaml

from clusterkit.cli import profiles
from clusterkit.cli.parser import run
from clusterkit.diagnose.site_profile import draft_profile, profile_yaml
from clusterkit.errors import PathError, SchedulerError
from clusterkit.load.loader import load_profile
from clusterkit.load.yaml_source import load_yaml_file
from clusterkit.schedulers.host import Completed
from clusterkit.schedulers.slurm_site import help_options, read_gres, read_site
from clusterkit.spec.profile import ClusterProfile, Login
from conftest import REPO

CAPTURED = REPO / "tests" / "fixtures" / "slurm_site"
REAL = {
    ("scontrol", "--oneliner", "show", "partition"): (CAPTURED / "scontrol_show_partition.txt").read_text(),
    ("scontrol", "--oneliner", "show", "node"): (CAPTURED / "scontrol_show_node.txt").read_text(),
    ("scontrol", "show", "config"): (CAPTURED / "scontrol_show_config.txt").read_text(),
    ("sbatch", "--help"): (CAPTURED / "sbatch_help.txt").read_text(),
    ("srun", "--help"): (CAPTURED / "srun_help.txt").read_text(),
}
NODE = (
    "NodeName={name} Arch=x86_64 CoresPerSocket=48  CPUAlloc=0 CPUEfctv={cpus} CPUTot={cpus} "
    "AvailableFeatures={features} ActiveFeatures={features} Gres={gres} NodeAddr={name} "
    "OS=Linux 6.1 #1 SMP RealMemory=2000000 AllocMem=0 MemSpecLimit=16000 Partitions={partitions}  State=IDLE"
)
PARTITION = "PartitionName={name} AllowGroups=ALL Default={default} MaxTime={max_time} Nodes=x State=UP"


class FakeHost:
    """SLURM's answers by argv; every command asked is kept."""

    name = "this machine"

    def __init__(self, answers: dict[tuple[str, ...], str], tools: str = "") -> None:
        self.answers, self.tools, self.asked = answers, tools, []

    def run(self, argv: Sequence[str], timeout: float = 30.0) -> Completed:
        self.asked.append(tuple(argv))
        if argv[0] == "sh":
            return Completed(0, self.tools, "")
        if tuple(argv) not in self.answers:
            return Completed(1, "", f"{argv[0]}: error: Unable to contact slurm controller (connect failure)")
        return Completed(0, self.answers[tuple(argv)], "")


def cluster(partitions: list[str], nodes: list[str], **real: str) -> dict[tuple[str, ...], str]:
    answers = dict(REAL)
    answers[("scontrol", "--oneliner", "show", "partition")] = "\n".join(partitions) + "\n"
    answers[("scontrol", "--oneliner", "show", "node")] = "\n".join(nodes) + "\n"
    return answers


def node(name: str, gres: str = "(null)", features: str = "(null)", partitions: str = "gpu", cpus: int = 96) -> str:
    return NODE.format(name=name, gres=gres, features=features, partitions=partitions, cpus=cpus)


def partition(name: str, default: bool = True, max_time: str = "2-00:00:00") -> str:
    return PARTITION.format(name=name, default="YES" if default else "NO", max_time=max_time)


def written_round_trip(tmp_path: Path, host: FakeHost, name: str = "site", **choices) -> tuple[dict, str]:
    """The profile's YAML for ``host``: loaded back by clusterkit's own YAML reader, it is exactly the
    values drafted, and it converts to a ClusterProfile."""
    draft = draft_profile(read_site(host), name, **choices)
    text = profile_yaml(draft, "heading")
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    loaded, _ = load_yaml_file(path)
    assert loaded == draft.values
    msgspec.convert(loaded, ClusterProfile, strict=True)
    return draft, text


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch):
    """`profile init` asks this fake instead of SLURM (the dev cluster's answers unless replaced)."""
    box = {"host": FakeHost(REAL)}

    @contextlib.contextmanager
    def asked_here(args):
        yield box["host"], None

    monkeypatch.setattr(profiles, "cluster_host", asked_here)
    return box


def test_the_dev_clusters_real_output_makes_a_profile_the_tiny_recipe_validates_on(
    tmp_path: Path, fake, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "dev-probed.yaml"
    assert run(["profile", "init", "dev-probed", "-o", str(out)]) == 0
    profile, _, _ = load_profile(str(out), tmp_path)
    assert (profile.accelerator, profile.gpus_per_node, profile.gpu_request) == ("gpu", 2, "gres")
    assert (profile.cpus_per_node, profile.mem_per_node, profile.partition) == (2, "6026M", "debug")
    assert profile.max_time is None and profile.interconnect == "none"  # MaxTime=UNLIMITED; no feature says
    text = out.read_text()
    assert "# scontrol show node: gpu GRES 2 on each of the 3 nodes\ngpus_per_node: 2\n" in text
    assert "# scontrol show partition: Default=YES\npartition: debug\n" in text
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"wrote {out}"
    assert any(line.startswith("not determined: interconnect: no node feature names it") for line in lines)
    assert any(line.startswith("not determined: gpu: the GRES (Gres=gpu:2) names no GPU model") for line in lines)
    assert "the tiny recipe (tiny-gpt2-cpu) validates on it" in lines
    # Six commands, none with a value of the user's: the fixed argv of slurm_site.
    assert [argv[:2] for argv in fake["host"].asked] == [
        ("scontrol", "--oneliner"),
        ("scontrol", "--oneliner"),
        ("scontrol", "show"),
        ("sbatch", "--help"),
        ("srun", "--help"),
        ("sh", "-c"),
    ]


def test_the_real_help_texts_are_probed_not_assumed() -> None:
    sbatch, srun = help_options(REAL[("sbatch", "--help")]), help_options(REAL[("srun", "--help")])
    assert {"gres", "gpus-per-node", "account", "time-min", "container"} <= sbatch
    assert "container-image" not in srun and "gpu-bind" in srun  # SLURM's own --container is not pyxis
    assert help_options("Usage: sbatch [OPTIONS(0)...]\n      --gpus-per-node=n  GPUs\n") == {"gpus-per-node"}


def test_typed_gres_and_infiniband_features_name_the_gpu_and_the_network(tmp_path: Path) -> None:
    nodes = [node(f"gpu{i}", "gpu:h100:8(S:0-1),nvme:1", "ib_ndr400,gpu_h100,location=rack1") for i in range(4)]
    draft, text = written_round_trip(tmp_path, FakeHost(cluster([partition("gpu")], nodes)))
    values = draft.values
    assert values["gpu"] == {"model": "H100-80GB", "memory_gb": 80, "vendor": "nvidia"}
    assert (values["gpus_per_node"], values["gpu_request"], values["interconnect"]) == (8, "gres", "infiniband")
    assert values["mem_per_node"] == "1984000M" and values["max_time"] == "2-00:00:00"  # RealMemory less MemSpecLimit
    assert "# node Features: ib_ndr400\ninterconnect: infiniband\n" in text
    assert not [line for line in draft.undetermined if line.startswith(("gpu:", "interconnect:"))]


@pytest.mark.parametrize(
    "features,interconnect",
    [
        ("efa", "efa"),
        ("slingshot11", "slingshot"),
        ("roce_v2", "roce"),
        ("hdr200", "infiniband"),
        ("nvme,bigmem", "none"),
    ],
)
def test_the_interconnect_is_read_from_node_features_or_left_neutral(features: str, interconnect: str) -> None:
    site = read_site(FakeHost(cluster([partition("gpu")], [node("n1", "gpu:4", features)])))
    assert draft_profile(site, "x").values["interconnect"] == interconnect


def test_features_naming_two_networks_leave_it_neutral_and_say_so() -> None:
    site = read_site(FakeHost(cluster([partition("gpu")], [node("n1", "gpu:4", "ib,efa")])))
    draft = draft_profile(site, "x")
    assert draft.values["interconnect"] == "none"
    assert any("node Features name infiniband and efa" in line for line in draft.undetermined)


def test_no_gpus_is_a_cpu_profile_the_tiny_recipe_validates_on(tmp_path: Path, fake) -> None:
    fake["host"] = FakeHost(cluster([partition("cpu", max_time="1:00:00")], [node("c1", partitions="cpu", cpus=64)]))
    out = tmp_path / "cpus.yaml"
    assert run(["profile", "init", "cpus", "-o", str(out)]) == 0
    profile, _, _ = load_profile(str(out), tmp_path)
    assert (profile.accelerator, profile.gpu_request, profile.gpus_per_node, profile.max_time) == (
        "cpu",
        "none",
        1,
        "1:00:00",
    )


def test_the_default_partition_is_taken_and_another_may_be_chosen(tmp_path: Path) -> None:
    host = FakeHost(
        cluster(
            [partition("small", default=False, max_time="30"), partition("big")],
            [node("s1", "gpu:a10:2", partitions="small", cpus=16), node("b1", "gpu:8", partitions="big,all")],
        )
    )
    site = read_site(host)
    assert draft_profile(site, "x").values["partition"] == "big"
    small = draft_profile(site, "x", partition="small").values
    assert (small["partition"], small["gpus_per_node"], small["cpus_per_node"], small["max_time"]) == (
        "small",
        2,
        16,
        "30",
    )
    assert small["gpu"]["model"] == "A10-24GB"


def test_nodes_that_differ_give_the_smallest_and_say_so(tmp_path: Path) -> None:
    nodes = [node("a", "gpu:4", cpus=32), node("b", "gpu:8", cpus=64), node("c", cpus=64)]
    draft, text = written_round_trip(tmp_path, FakeHost(cluster([partition("gpu")], nodes)))
    assert (draft.values["gpus_per_node"], draft.values["cpus_per_node"]) == (4, 32)
    assert "gpu GRES from 4 to 8 on 2 of 3 nodes: the smallest" in text


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--partition", "nope"], "--partition 'nope': no such partition (the cluster has 'a', 'b')"),
        ([], "2 partitions and none is the default: choose one with --partition ('a', 'b')"),
    ],
)
def test_a_partition_that_cannot_be_chosen_is_one_line_and_exit_2(
    tmp_path: Path, fake, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    fake["host"] = FakeHost(cluster([partition("a", False), partition("b", False)], [node("n", partitions="a,b")]))
    assert run(["profile", "init", "x", "-o", str(tmp_path / "x.yaml"), *argv]) == 2
    assert capsys.readouterr().err == f"clusterkit: {message}\n"
    assert not list(tmp_path.iterdir())


HOSTILE = [
    "quo\"te's",
    "colon:#hash",
    "-dash",
    "{flow}",
    "*alias",
    "ctrl\x1b[31mred",
    "bell\x07",
    "del\x7f",
    "nel\x85line",
    "bom\ufeff",
    "yes",
    "0x1F",
    "1:00:00",
    "~",
]


@pytest.mark.parametrize("name", HOSTILE, ids=[ascii(n) for n in HOSTILE])
def test_hostile_partition_names_features_and_gres_types_never_break_the_yaml(tmp_path: Path, name: str) -> None:
    nodes = [node("n1", f"gpu:{name.replace(',', '')}:4", f"{name},x", partitions=name)]
    host = FakeHost(cluster([partition(name)], nodes))
    host.answers[("scontrol", "show", "config")] = f"SLURM_VERSION = 23.02{name}\n"
    draft, text = written_round_trip(tmp_path, host)
    assert all(line.startswith("#") or not any(c in line for c in "\x1b\x07\x7f\x85") for line in text.splitlines())
    if "partition" in draft.values:
        assert draft.values["partition"] == name  # SLURM names hold no spaces: one word each
    else:  # a name no profile field may hold (control characters) is said, not written
        assert any(line.startswith("partition: ") for line in draft.undetermined)


def test_a_control_character_in_what_is_printed_is_escaped(tmp_path: Path, fake, capsys) -> None:
    fake["host"] = FakeHost(cluster([partition("gpu")], [node("n1", "gpu:evil\x1b]0;pwn\x07:4")]))
    assert run(["profile", "init", "x", "-o", str(tmp_path / "x.yaml")]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out and "evil\\x1b]0;pwn\\x07" in out


def test_an_absurd_count_is_refused_into_a_line_and_the_profile_still_loads(tmp_path: Path) -> None:
    host = FakeHost(cluster([partition("gpu")], [node("n1", "gpu:99999999", cpus=123456789)]))
    draft, _ = written_round_trip(tmp_path, host)
    assert (draft.values["gpus_per_node"], draft.values["cpus_per_node"]) == (1, 1)
    assert sum(line.startswith(("gpus_per_node:", "cpus_per_node:")) for line in draft.undetermined) == 2


@pytest.mark.parametrize("kind", ["file", "fifo", "dangling link", "folder"])
def test_an_existing_output_is_never_replaced_and_the_cluster_is_not_asked(
    tmp_path: Path, fake, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    out = tmp_path / "site.yaml"
    if kind == "file":
        out.write_text("mine\n")
    elif kind == "fifo":
        os.mkfifo(out)
    elif kind == "dangling link":
        out.symlink_to(tmp_path / "nowhere")
    else:
        out.mkdir()
    assert run(["profile", "init", "site", "-o", str(out)]) == 2
    assert (
        capsys.readouterr().err
        == f"clusterkit: {out}: already exists; nothing written (give another NAME, or -o FILE)\n"
    )
    assert fake["host"].asked == []
    assert kind != "file" or out.read_text() == "mine\n"
    assert kind != "dangling link" or not (tmp_path / "nowhere").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["site.yaml"]


def test_a_file_made_while_the_cluster_was_asked_is_not_replaced(tmp_path: Path) -> None:
    out = tmp_path / "site.yaml"
    out.write_text("made meanwhile\n")
    with pytest.raises(PathError, match="already exists"):
        profiles.write_new(out, "name: site\n")
    assert out.read_text() == "made meanwhile\n" and sorted(p.name for p in tmp_path.iterdir()) == ["site.yaml"]


def test_racing_writers_leave_one_whole_file(tmp_path: Path) -> None:
    out, results = tmp_path / "site.yaml", []
    texts = [f"name: writer{i}\n" * 2000 for i in range(8)]

    def write(text: str) -> None:
        try:
            profiles.write_new(out, text)
            results.append(text)
        except PathError:
            pass

    threads = [threading.Thread(target=write, args=(text,)) for text in texts]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 1 and out.read_text() == results[0]
    assert [p.name for p in tmp_path.iterdir()] == ["site.yaml"]


@pytest.mark.parametrize("name", ["../x", "a/b", ".hidden", "x.yaml", "", "with space", "a" * 65, "nul\x00", "-x"])
def test_a_name_that_is_not_a_safe_file_name_stops_before_anything(
    tmp_path: Path, fake, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    assert run(["profile", "init", "--", name]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"clusterkit: profile name {ascii(name)}: letters, digits") and err.count("\n") == 1
    assert fake["host"].asked == [] and not (tmp_path / "config").exists()


def test_by_default_it_goes_where_cluster_name_finds_it(
    tmp_path: Path, fake, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.chdir(tmp_path)
    assert run(["profile", "init", "my-site"]) == 0
    written = tmp_path / "config" / "clusterkit" / "clusters" / "my-site.yaml"
    assert capsys.readouterr().out.startswith(f"wrote {written}\n")
    profile, path, _ = load_profile("my-site", tmp_path / "elsewhere")
    assert path == written and profile.name == "my-site"
    assert run(["profile", "init", "my-site"]) == 2  # the second time: there already


def test_json_says_every_value_where_it_came_from_and_what_was_not_determined(tmp_path: Path, fake, capsys) -> None:
    import json

    assert run(["profile", "init", "x", "-o", str(tmp_path / "x.yaml"), "--json"]) == 0
    said = json.loads(capsys.readouterr().out)
    assert said["profile"]["gpus_per_node"] == 2 and set(said["origins"]) == set(said["profile"])
    assert (
        said["slurm_version"] == "22.05.8"
        and said["tiny_recipe_errors"] == []
        and said["path"] == str(tmp_path / "x.yaml")
    )
    assert any(line.startswith("interconnect:") for line in said["undetermined"])


def test_a_time_limit_below_the_tiny_recipes_is_a_warning_line(tmp_path: Path, fake, capsys) -> None:
    fake["host"] = FakeHost(cluster([partition("gpu", max_time="5")], [node("n1", "gpu:4")]))
    assert run(["profile", "init", "x", "-o", str(tmp_path / "x.yaml")]) == 0
    out = capsys.readouterr().out
    assert "tiny recipe: " in out and "warning: resources.time: 00:10:00 is above cluster 'x' max_time 5" in out


def test_a_profile_the_tiny_recipe_does_not_validate_on_is_written_and_exit_1(
    tmp_path: Path, fake, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    tiny = yaml.safe_load((REPO / "recipes" / "tiny-gpt2-cpu.yaml").read_text())
    (tmp_path / "nsys.yaml").write_text(yaml.safe_dump({**tiny, "profile": {"kind": "nsys", "steps": "2-3"}}))
    monkeypatch.setattr(profiles, "TINY_RECIPE", str(tmp_path / "nsys.yaml"))  # nsys needs GPUs
    fake["host"] = FakeHost(cluster([partition("cpu")], [node("c1", partitions="cpu")]))
    assert run(["profile", "init", "x", "-o", str(tmp_path / "x.yaml")]) == 1
    out = capsys.readouterr().out
    assert (tmp_path / "x.yaml").is_file() and "tiny recipe: " in out and "profile.kind: nsys profiles GPU work" in out


def test_slurm_that_does_not_answer_is_exit_1_and_nothing_written(tmp_path: Path, fake, capsys) -> None:
    fake["host"] = FakeHost({})
    assert run(["profile", "init", "x", "-o", str(tmp_path / "x.yaml")]) == 1
    assert "Unable to contact slurm controller" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())
    with pytest.raises(SchedulerError):
        read_site(FakeHost({}))


def test_cluster_asks_on_that_profiles_login_node_and_the_new_profile_names_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    opened = []
    host = FakeHost(REAL)
    host.name = "login.example.org"

    @contextlib.contextmanager
    def open_scheduler(name, login, accept_new_host_key=False):
        opened.append((name, login.host, accept_new_host_key))
        yield type("SSH", (), {"host": host})()

    monkeypatch.setattr("clusterkit.schedulers.api.open_scheduler", open_scheduler)
    clusters = tmp_path / "clusters"
    clusters.mkdir()
    (clusters / "remote.yaml").write_text(
        yaml.safe_dump(
            {
                **yaml.safe_load((REPO / "recipes/clusters/dev.yaml").read_text()),
                "name": "remote",
                "login": {"host": "login.example.org", "user": "me"},
            }
        )
    )
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "probed.yaml"
    assert run(["profile", "init", "probed", "--cluster", "remote", "--accept-new-host-key", "-o", str(out)]) == 0
    assert opened == [("ssh", "login.example.org", True)] and len(host.asked) == 6
    profile, _, _ = load_profile(str(out), tmp_path)
    assert profile.login == Login(host="login.example.org", user="me")
    assert "asked on login.example.org" in out.read_text()


def test_cluster_without_a_login_node_and_a_bad_login_are_one_line(tmp_path: Path, capsys) -> None:
    assert run(["profile", "init", "x", "--cluster", "dev", "-o", str(tmp_path / "x.yaml")]) == 2
    assert "cluster profile 'dev' names no login node" in capsys.readouterr().err
    assert run(["profile", "init", "x", "--login=-oProxyCommand=sh", "-o", str(tmp_path / "x.yaml")]) == 2
    assert capsys.readouterr().err.startswith("clusterkit: --login '-oProxyCommand=sh': a host name")


def test_gres_text_is_read_as_slurm_writes_it() -> None:
    assert read_gres("gpu:h100:8(S:0-1),nvme:1") == read_gres("gpu:h100:8,nvme:1")
    assert [(g.name, g.type, g.count) for g in read_gres("gpu:a100:4(S:0,1),gpu:v100:2,bad,gpu:x:y,(null)")] == [
        ("gpu", "a100", 4),
        ("gpu", "v100", 2),
    ]
    assert read_gres("gpu:\u00b2") == ()  # a digit Python knows but int() need not


def test_json_has_the_documented_shape(tmp_path: Path, fake, capsys) -> None:
    import json

    from test_json_shapes import as_documented

    assert run(["profile", "init", "dev-probed", "-o", str(tmp_path / "x.yaml"), "--json"]) == 0
    done = type("Done", (), {"stdout": capsys.readouterr().out})
    as_documented(done, "clusterkit profile init --json NAME")
    assert json.loads(done.stdout)["found_by_name"] is False  # -o elsewhere: cluster: dev-probed does not find it


def test_a_profile_another_folder_shadows_is_said(
    tmp_path: Path, fake, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "clusters").mkdir()
    (tmp_path / "clusters" / "site.yaml").write_text((REPO / "recipes" / "clusters" / "dev.yaml").read_text())
    assert run(["profile", "init", "site"]) == 0
    written = tmp_path / "config" / "clusterkit" / "clusters" / "site.yaml"
    assert (
        f"a recipe's cluster: site finds {tmp_path / 'clusters' / 'site.yaml'} first: write cluster: {written}\n"
        in (capsys.readouterr().out)
    )


def test_slurms_placeholders_are_not_taken_for_values() -> None:
    """RealMemory=1 is SLURM's default for a node slurm.conf gives no memory (a --mem=1M would kill
    every job where memory is enforced); a partition not UP and nodes that list no partition are said."""
    unset = node("n1", "gpu:4", partitions="(null)").replace("RealMemory=2000000", "RealMemory=1")
    down = partition("gpu").replace("State=UP", "State=DOWN")
    draft = draft_profile(read_site(FakeHost(cluster([down], [unset]))), "x")
    assert "mem_per_node" not in draft.values and draft.values["gpus_per_node"] == 4
    assert [
        line.split(":")[0] for line in draft.undetermined if not line.startswith(("gpu", "interconnect", "sbatch"))
    ] == [
        "nodes",
        "partition",
        "mem_per_node",
    ]


def test_a_config_folder_that_is_a_file_stops_before_the_cluster_is_asked(
    tmp_path: Path, fake, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    (tmp_path / "config" / "clusterkit").mkdir(parents=True)
    (tmp_path / "config" / "clusterkit" / "clusters").write_text("a file\n")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    assert run(["profile", "init", "x"]) == 2
    assert capsys.readouterr().err.count("\n") == 1 and fake["host"].asked == []


def test_pyxis_and_apptainer_are_found_and_the_container_block_to_add_is_written(tmp_path: Path) -> None:
    answers = cluster([partition("gpu")], [node("n1", "gpu:8")])
    answers[("srun", "--help")] += "      --container-image=[USER@][REGISTRY#]IMAGE[:TAG]|PATH  [pyxis] the image\n"
    draft, text = written_round_trip(tmp_path, FakeHost(answers, tools="apptainer\nenroot\n"))
    assert "# pyxis is here (srun --help lists --container-image): to run jobs in an image add\n" in text
    assert "# container: {image: /path/to/image.sif, runtime: apptainer}\n" in text
    assert "container" not in draft.values  # the image is the user's to name
    for tool, image in [
        ("docker", "nvcr.io/nvidia/pytorch:24.05-py3"),
        ("shifter", "docker:nvcr.io/nvidia/pytorch:24.05-py3"),
    ]:
        (tmp_path / tool).mkdir()
        answers = cluster([partition("gpu")], [node("n1", "gpu:8")])
        _, text = written_round_trip(tmp_path / tool, FakeHost(answers, tools=f"{tool}\n"))
        assert f"# container: {{image: {image}, runtime: {tool}}}\n" in text  # an image of a kind it runs
    plain = read_site(FakeHost(REAL, tools="sh: 1: weird\x1boutput\n"))
    assert plain.container_tools == () and not [n for n in draft_profile(plain, "x").notes if "container" in n]

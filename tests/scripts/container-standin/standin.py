#!/usr/bin/env python3
"""A STAND-IN for the container runtimes clusterkit starts on each node (``singularity exec``,
``docker run``, ``podman run``, ``shifter``, ``enroot``), named by the link it is called through.
Singularity, Shifter and enroot are not Debian packages, and docker/podman have no daemon or image in tests, so no real
container can run here. It takes exactly the options clusterkit writes, with each runtime's rules
where they can be checked without an image (a bind/volume source must exist, docker's user must be
this process's, variables are given to docker/podman by NAME only), refuses anything else, records
the call in ``$RUN_DIR/container-calls.jsonl`` and runs the command on the host: no mount namespace,
so a mount must show a folder at its own path. docker/podman see only the variables named by
``--env`` (plus PATH and HOME, which an image has of its own), as a real container would."""

import json
import os
import re
import subprocess
import sys

runtime = os.path.basename(sys.argv[0])
args = sys.argv[1:]
seen = {"runtime": runtime, "argv": list(args), "node": os.environ.get("SLURMD_NODENAME")}


def refuse(message):
    sys.exit(f"{runtime} stand-in: {message}")


def mount(spec):
    source, _, rest = spec.partition(":")
    target = rest.split(":")[0] or source
    if not os.path.exists(source):
        refuse(f"mount source {source} does not exist")
    if os.path.normpath(target) != os.path.normpath(source):
        refuse(f"cannot show {source} at {target} without a container")
    return source


def take(flags):
    """Options until the first word that is not one: (flag, value) pairs, '--flag=value' or '--flag value'."""
    taken = []
    while args and args[0].startswith("-") and args[0] != "--":  # "--": the options end
        word = args.pop(0)
        flag, eq, value = word.partition("=")
        if flag not in flags:
            refuse(f"unsupported option {word}")
        if flags[flag] and not eq:
            value = args.pop(0)
        taken.append((flag, value))
    return taken


env = dict(os.environ)
if runtime == "singularity":
    if not args or args.pop(0) != "exec":
        refuse("only 'exec' is available")
    options = take({"--nv": False, "--rocm": False, "--bind": True, "--pwd": True})
    image = args.pop(0)
    if not (os.path.exists(image) or image.startswith("docker://")):
        refuse(f"could not open image {image}")
    for flag, value in options:
        if flag == "--bind":
            for spec in value.split(","):
                mount(spec)
        elif flag == "--pwd":
            os.chdir(value)
elif runtime in ("docker", "podman"):
    if not args or args.pop(0) != "run":
        refuse("only 'run' is available")
    flags = {"--rm": False, "--init": False, "--network": True, "--ipc": True, "--name": True, "--volume": True}
    flags.update({"--workdir": True, "--env": True, "--gpus": True, "--device": True, "--group-add": True})
    flags.update({"--user": True} if runtime == "docker" else {"--userns": True, "--rootfs": True})
    options = take(flags)
    given = dict(options)
    for required in ("--rm", "--init", "--network", "--ipc", "--name", "--workdir"):
        if required not in given:
            refuse(f"{required} missing")
    if given["--network"] != "host" or given["--ipc"] != "host":
        refuse("the ranks need the host's network and IPC")
    if not re.fullmatch(r"[a-zA-Z0-9][a-zA-Z0-9_.-]+", given["--name"]):
        refuse(f"invalid container name {given['--name']!r}")
    if runtime == "docker" and given.get("--user") != f"{os.getuid()}:{os.getgid()}":
        refuse(f"--user={given.get('--user')} is not this user's ids")
    if runtime == "podman" and given.get("--userns") != "keep-id":
        refuse("rootless podman needs --userns=keep-id")
    names = [value for flag, value in options if flag == "--env"]
    if any("=" in name for name in names):
        refuse("a value on the command line: clusterkit passes variables by name")
    for flag, value in options:
        if flag == "--volume":
            mount(value)
    image = given.get("--rootfs") or args.pop(0)
    env = {name: os.environ[name] for name in names if name in os.environ}
    env.update(PATH=os.environ["PATH"], HOME=os.environ.get("HOME", "/"))  # the image's own
    seen["env"] = sorted(env)
    os.chdir(given["--workdir"])
elif runtime == "shifter":
    options = take({"--image": True, "--module": True, "--volume": True, "--workdir": True})
    given = dict(options)
    if not given.get("--image", "").startswith("docker:"):
        refuse("--image=docker:NAME[:TAG] missing")
    for flag, value in options:
        if flag == "--volume":
            mount(value)
    image = given["--image"]
    if "--workdir" in given:
        os.chdir(given["--workdir"])
elif runtime == "enroot":  # NVIDIA's enroot: import, create, start, remove (its containers in ENROOT_DATA_PATH)
    # Each node's own (the local executor's nodes share this machine's disk); its batch shell, which has
    # no SLURMD_NODENAME (SLURM's has), is on the allocation's first node.
    node = seen["node"] or os.environ["SLURM_JOB_NODELIST"].split(",")[0]
    data = os.path.join(os.environ.get("ENROOT_DATA_PATH") or refuse("ENROOT_DATA_PATH is not set"), node)
    verb = args.pop(0) if args else refuse("no command")

    def container(name):
        if not re.fullmatch(r"[^/.][^/]*", name):
            refuse(f"invalid container name {name!r}")
        return os.path.join(data, name)

    def record(**more):
        seen.update(verb=verb, **more)
        with open(os.path.join(os.environ["RUN_DIR"], "container-calls.jsonl"), "a") as calls:
            calls.write(json.dumps(seen) + "\n")

    if verb == "import":
        given = dict(take({"--output": True}))
        uri = args.pop(0) if len(args) == 1 else refuse(f"one URI expected, got {args}")
        if not uri.startswith("docker://"):
            refuse(f"unsupported URI {uri}")
        if os.path.exists(given["--output"]):
            refuse(f"file already exists: {given['--output']}")
        with open(given["--output"], "w") as out:  # a squashfs file stands in as its source's name
            out.write(uri)
        record(image=uri)
        sys.exit(0)
    if verb == "create":
        given = dict(take({"--force": False, "--name": True}))
        image = args[1] if args[:1] == ["--"] and len(args) == 2 else refuse(f"-- IMAGE expected, got {args}")
        if not image.endswith(".sqsh") or not os.path.isfile(image):
            refuse(f"not a squashfs image: {image}")
        root = container(given["--name"])
        if os.path.exists(root) and "--force" not in given:
            refuse(f"container already exists: {given['--name']}")
        os.makedirs(root, exist_ok=True)
        with open(os.path.join(root, "image"), "w") as out:
            out.write(image)
        record(image=image)
        sys.exit(0)
    if verb == "remove":
        take({"--force": False})
        if args[:1] != ["--"] or len(args) < 2:
            refuse(f"-- NAME... expected, got {args}")
        for name in args[1:]:
            root = container(name)
            if not os.path.isdir(root):
                refuse(f"no such container: {name}")
            os.remove(os.path.join(root, "image"))
            os.rmdir(root)
        record()
        sys.exit(0)
    if verb != "start":
        refuse(f"unsupported command {verb}")
    options = take({"--conf": True, "--mount": True, "--env": True, "--rw": False, "--root": False})
    for flag, value in options:
        if flag == "--mount":
            mount(value)
    name = args.pop(0) if args else refuse("no container")
    if not os.path.isdir(container(name)):
        refuse(f"no such container: {name} (enroot create it first)")
    with open(os.path.join(container(name), "image")) as made:
        image = made.read()
    # Only what enroot gives: its configuration script's environ() (sourced by bash with the host's
    # environment, one KEY=VALUE a line), then each --env: NAME the host's value (an unset one empty:
    # enroot's awk), NAME=VALUE as given. PATH and HOME: the image's own.
    lines = []
    for flag, value in options:
        if flag == "--conf":
            script = 'source "$1"; if declare -F environ >/dev/null; then environ; fi'
            done = subprocess.run(["bash", "-c", script, "conf", value], capture_output=True, text=True)
            sys.stderr.write(done.stderr)
            if done.returncode:
                refuse(f"configuration script {value} failed")
            lines += done.stdout.splitlines()
        elif flag == "--env":
            lines.append(value if "=" in value else f"{value}={os.environ.get(value, '')}")
    env = dict(PATH=os.environ["PATH"], HOME=os.environ.get("HOME", "/"))
    for line in lines:
        key, eq, val = line.partition("=")
        if not (eq and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key)):
            refuse(f"ill-formed environment line {line!r}")
        env[key] = val
    seen["env"] = sorted(env)
    seen["verb"] = verb
else:
    refuse("call me through a link named singularity, docker, podman, shifter or enroot")
if not args:
    refuse("no command")
seen.update(image=image, command=list(args))
with open(os.path.join(os.environ["RUN_DIR"], "container-calls.jsonl"), "a") as calls:
    calls.write(json.dumps(seen) + "\n")
os.execvpe(args[0], args, env)

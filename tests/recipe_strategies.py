"""Hypothesis strategies for hostile and broken recipes and cluster profiles: random structures,
types, unicode, huge numbers and deep nesting, mixed into otherwise plausible recipes so that the
generated input reaches every stage (schema, profile, layout checks, rendering)."""

from __future__ import annotations

from hypothesis import strategies as st

RECIPE_KEYS = [
    "name",
    "cluster",
    "extends",
    "resources",
    "parallelism",
    "launcher",
    "precision",
    "task",
    "network",
    "deepspeed",
    "preemption",
    "env",
    "setup",
    "runs_dir",
    "master_port",
    "python",
    "resume_from",
    "description",
    "steps",
]
NESTED_KEYS = [
    "nodes",
    "gpus_per_node",
    "cpus_per_task",
    "time",
    "partition",
    "dp",
    "tp",
    "pp",
    "zero_stage",
    "micro_batch_size",
    "global_batch_size",
    "gradient_accumulation_steps",
    "offload_optimizer",
    "trainer",
    "script",
    "args",
    "model",
    "config",
    "dataset",
    "profile",
    "env",
    "debug",
    "signal",
    "max_requeues",
    "include",
    "exclude",
    "extra_sbatch",
    "type",
    "seq_len",
    "pretrained",
]

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=40),
    st.sampled_from(
        [
            "$(touch /tmp/clusterkit-fuzz)",
            "`id`",
            "a\nb",
            "{{ 7*7 }}",
            "%j",
            "auto",
            "cpu",
            "deepspeed",
            "torchrun",
            "2",
            "-1",
            "1:00:00",
            "dev",
            "../../etc/passwd",
            "\u202e\u0000",
            "é" * 3,
        ]
    ),
)


def _values(depth: int):
    if depth <= 0:
        return scalars
    child = _values(depth - 1)
    return st.one_of(
        scalars,
        st.lists(child, max_size=4),
        st.dictionaries(st.one_of(st.sampled_from(NESTED_KEYS), st.text(max_size=12)), child, max_size=5),
    )


values = _values(4)
# Occasionally absurdly deep nesting (the loader must refuse it cleanly, not recurse forever).
deep = st.integers(min_value=30, max_value=200).map(lambda n: _nest(n))


def _nest(depth: int) -> dict:
    node: dict = {"leaf": 1}
    for _ in range(depth):
        node = {"x": node}
    return node


VALID = {
    "name": "fuzz",
    "cluster": "dev",
    "launcher": "torchrun",
    "resources": {"nodes": 2, "gpus_per_node": 2, "time": "10"},
    "parallelism": {"micro_batch_size": 2, "zero_stage": 0},
    "task": {
        "trainer": {
            "model": {"config": {"model_type": "gpt2", "n_layer": 2, "n_head": 4, "n_embd": 64, "vocab_size": 512}},
            "dataset": {"type": "synthetic", "seq_len": 32},
            "args": {"max_steps": 5},
        }
    },
    "env": {"A": "1"},
    "setup": ["true"],
}
# The same job as several steps (steps:): the built-in trainer's, and a script's trials on one node.
VALID_STEPS = {
    **{key: value for key, value in VALID.items() if key != "task"},
    "steps": [
        {"name": "prep", "nodes": 1, "task": {"script": "prep.py", "args": ["--seed={trial}"]}, "repeat": 2},
        {"name": "train", "task": VALID["task"], "env": {"S": "{trial}"}},
    ],
}
PATHS = [
    (),
    ("resources",),
    ("parallelism",),
    ("task",),
    ("task", "trainer"),
    ("task", "trainer", "args"),
    ("task", "trainer", "model"),
    ("task", "trainer", "model", "config"),
    ("task", "trainer", "dataset"),
    ("env",),
    ("network",),
    ("deepspeed",),
    ("preemption",),
]


def _mutate(recipe: dict, mutations: list) -> dict:
    import copy

    result = copy.deepcopy(recipe)
    for path, key, value in mutations:
        node = result
        for part in path:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        node[key] = value
    return result


mutation = st.tuples(st.sampled_from(PATHS), st.sampled_from(RECIPE_KEYS + NESTED_KEYS), st.one_of(values, deep))
# A valid recipe with a few random changes: reaches every check and the renderer.
recipes = st.builds(_mutate, st.sampled_from([VALID, VALID_STEPS]), st.lists(mutation, min_size=0, max_size=3))
# Any structure at all, the recipe file's whole content.
anything = st.one_of(values, deep)
profiles = st.builds(
    lambda extra: {
        "name": "p",
        "gpus_per_node": 2,
        "cpus_per_node": 2,
        "interconnect": "loopback",
        "accelerator": "cpu",
        **extra,
    },
    st.dictionaries(
        st.sampled_from(
            [
                "gpus_per_node",
                "accelerator",
                "interconnect",
                "gpu",
                "modules",
                "setup",
                "max_time",
                "container",
                "network_env",
                "bogus",
            ]
        ),
        values,
        max_size=4,
    ),
)

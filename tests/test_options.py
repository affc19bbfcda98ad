"""The cosim options: defaults loaded on import, one check and one error text each."""

from __future__ import annotations

import importlib.resources
import re
import warnings
from pathlib import Path
from typing import Any

import dask
import jsonschema
import numpy as np
import pytest
import torch
import yaml

import dask_cosim  # loads the defaults
from dask_cosim import config_keys, options


def test_defaults_come_from_cosim_yaml() -> None:
    assert options.eps() == 1e-8
    assert options.device() == "auto"
    assert options.torch_dtype() is None
    assert options.chunk_bytes() == {"cpu": 512 * 2**10, "cuda": 256 * 2**20}
    assert options.memory_map() == "auto"
    assert options.gpu_partition_bytes() == 2**30
    assert options.gpu_partition_bytes("64MiB") == 64 * 2**20


def test_config_and_arguments() -> None:
    with dask.config.set({"cosim.eps": "1e-6", "cosim.device": "cuda:1", "cosim.dtype": "float64"}):
        assert options.eps() == 1e-6
        assert options.device() == "cuda:1"
        assert options.torch_dtype() is torch.float64
        assert options.eps(0) == 0.0  # an argument wins over the config
    assert options.torch_dtype(np.float32) is torch.float32
    assert options.torch_dtype(torch.float64) is torch.float64
    assert options.torch_dtype(None, from_config=False) is None
    with dask.config.set({"cosim.chunk-bytes.cpu": "1MiB"}):
        assert options.chunk_bytes() == {"cpu": 2**20, "cuda": 256 * 2**20}
        assert options.chunk_bytes({"cuda": 4096}) == {"cpu": 2**20, "cuda": 4096}
    assert options.chunk_bytes("2KiB") == {"cpu": 2048, "cuda": 2048}


@pytest.mark.parametrize(
    ("check", "value", "message"),
    [
        (options.eps, -1, "eps=-1 must be a finite number >= 0"),
        (options.eps, "tiny", "eps='tiny' must be a finite number >= 0"),
        (options.eps, float("nan"), "eps=nan must be a finite number >= 0"),
        (options.eps, True, "eps=True must be a finite number >= 0"),
        (options.device, "gpu", "device='gpu' is not a device; use 'auto', 'cpu', 'cuda'"),
        (options.device, "cuda:x", "device='cuda:x' is not a device"),
        (options.torch_dtype, "float16", "dtype='float16' is not supported; use 'float32'"),
        (options.chunk_bytes, 0, "chunk_bytes['cpu']=0 must be a positive size"),
        (options.chunk_bytes, "lots", "chunk_bytes['cpu']='lots' must be a positive size"),
        (options.chunk_bytes, {"tpu": 1}, "unknown device kinds ['tpu']"),
        (options.memory_map, "yes", "cosim.read.memory-map='yes'; use 'auto', true or false"),
        (options.gpu_partition_bytes, 0, "cosim.read.gpu-partition-bytes=0 must be a positive"),
        (options.gpu_partition_bytes, True, "cosim.read.gpu-partition-bytes=True must be"),
        (options.search_k, 0, "k=0 must be an integer >= 1"),
        (options.search_k, 2.0, "k=2.0 must be an integer >= 1"),
        (options.search_threshold, 1.5, "threshold=1.5 must be a number in [-1, 1]"),
        (options.search_threshold, "high", "threshold='high' must be a number in [-1, 1]"),
        (options.search_threshold, True, "threshold=True must be a number in [-1, 1]"),
        (options.search_threshold, "0.5", "threshold='0.5' must be a number in [-1, 1]"),
        (options.search_threshold, b"1", "threshold=b'1' must be a number in [-1, 1]"),
        (options.search_precision, "half", "cosim.search.precision='half'; use 'exact'"),
        (options.search_max_blocks, 0, "cosim.search.max-blocks=0 must be an integer >= 1"),
        (lambda v: options.positive_int("workers", v, "workers=2"), 0, "workers=0 must be a"),
        (lambda v: options.memory_size("memory_limit", v, "4GiB"), "lots", "'lots' is not a size"),
    ],
)
def test_each_option_has_one_error(check: Any, value: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("(", r"\(")):
        check(value)


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("iterations", -1, "cosim.search.clustered.iterations=-1 must be an integer >= 0"),
        ("min-sample", 0.5, "cosim.search.clustered.min-sample=0.5 must be an integer >= 1"),
        ("block-bytes", "big", "cosim.search.clustered.block-bytes='big' must be a positive"),
        ("route-bytes", 0, "cosim.search.clustered.route-bytes=0 must be a positive"),
    ],
)
def test_clustered_options(key: str, value: Any, message: str) -> None:
    assert options.clustered().block_bytes == options.clustered().route_bytes == 256 * 2**20
    with dask.config.set({f"cosim.search.clustered.{key}": value}):
        with pytest.raises(ValueError, match=message):
            options.clustered()


def test_search_arguments() -> None:
    assert options.search_k(None) is None and options.search_k(np.int64(3)) == 3
    assert (
        options.search_threshold(None) is None and options.search_threshold(np.float32(0.5)) == 0.5
    )
    with pytest.raises(ValueError, match="topk needs k"):
        options.search_k(None, required=True)
    with pytest.raises(ValueError, match="threshold=None must be a number"):
        options.search_threshold(None, required=True)
    with pytest.raises(ValueError, match=r"give k .*, threshold .*, or both"):
        options.k_or_threshold(None, None)
    assert options.k_or_threshold(2, None) == (2, None)
    assert options.memory_size("memory_limit", 0.5, "4GiB") is None


def test_placement_rates() -> None:
    """The measured constants of device="auto" (their sources are in cosim.yaml)."""
    rates = options.placement_rates()
    assert (rates.cpu_fused, rates.cpu_torch, rates.host_to_gpu) == (77.5e9, 2.1e9, 51.4e9)
    assert rates.gpu_fixed == 1e-3
    with dask.config.set({"cosim.placement.host-to-gpu": "25GB", "cosim.placement.gpu-fixed": 0}):
        assert options.placement_rates().host_to_gpu == 25e9
        assert options.placement_rates().gpu_fixed == 0.0
    for key, bad, message in [
        ("cpu-torch", 0, "cosim.placement.cpu-torch=0 must be a positive size"),
        ("host-to-gpu", "fast", "cosim.placement.host-to-gpu='fast' must be a positive size"),
        ("gpu-fixed", "soon", "cosim.placement.gpu-fixed='soon' must be a duration"),
        ("gpu-fixed", -1, "cosim.placement.gpu-fixed=-1 must be a duration"),
    ]:
        with dask.config.set({f"cosim.placement.{key}": bad}):
            with pytest.raises(ValueError, match=message):
                options.placement_rates()


def test_bad_config_is_reported_where_it_is_used() -> None:
    with dask.config.set({"cosim.eps": -5}), pytest.raises(ValueError, match="eps=-5"):
        options.eps()


@pytest.mark.parametrize(
    ("config", "check", "message"),
    [
        ({"cosim.eps": "abc"}, options.eps, "cosim.eps='abc' must be a finite number"),
        ({"cosim.device": "gpu"}, options.device, "cosim.device='gpu' is not a device"),
        ({"cosim.dtype": "int8"}, options.torch_dtype, "cosim.dtype='int8' is not supported"),
        ({"cosim.chunk-bytes.cpu": "lots"}, options.chunk_bytes, "cosim.chunk-bytes.cpu='lots'"),
        ({"cosim.chunk-bytes": 0}, options.chunk_bytes, "cosim.chunk-bytes=0 must be a positive"),
        ({"cosim.chunk-bytes.tpu": 1}, options.chunk_bytes, "cosim.chunk-bytes has unknown"),
        (
            {"cosim.search.tile-bytes.cuda": 0},
            options.search_tile_bytes,
            "cosim.search.tile-bytes.cuda=0",
        ),
    ],
)
def test_a_bad_config_value_is_named_by_its_key(
    config: dict[str, Any], check: Any, message: str
) -> None:
    """A value from the config is named by its key (what DASK_COSIM__EPS=abc or a YAML
    file set); test_each_option_has_one_error: a value given as an argument, by the
    argument's name."""
    with dask.config.set(config), pytest.raises(ValueError, match=f"^{re.escape(message)}"):
        check()


def test_an_argument_is_named_as_given_beside_the_config() -> None:
    """chunk_bytes(): the kind given is named as the argument, the other by its key."""
    with dask.config.set({"cosim.chunk-bytes.cuda": "none"}):
        with pytest.raises(ValueError, match=r"^cosim\.chunk-bytes\.cuda='none'"):
            options.chunk_bytes({"cpu": 4096})
        with pytest.raises(ValueError, match=r"^chunk_bytes\['cuda'\]=0 must"):
            options.chunk_bytes({"cuda": 0})
    with dask.config.set({"cosim.eps": "abc"}), pytest.raises(ValueError, match=r"^eps=-1 "):
        options.eps(-1)


def test_pairwise_names_the_config_key() -> None:
    """DASK_COSIM__EPS=abc reaches pairwise as cosim.eps: the error names that key."""
    import pandas as pd

    pdf = pd.DataFrame({"a": [np.ones(3, np.float32)]})
    with dask.config.set({"cosim.eps": "abc"}), pytest.raises(ValueError, match=r"^cosim\.eps="):
        pdf.cosim.pairwise("a", "a")
    with pytest.raises(ValueError, match=r"^eps='abc'"):
        pdf.cosim.pairwise("a", "a", eps="abc")


def test_search_options() -> None:
    assert options.search_tile_bytes() == {"cpu": 32 * 2**20, "cuda": 512 * 2**20}
    assert options.search_split_every() == 8
    assert options.search_precision() == "exact" and options.search_max_blocks() == 64
    with dask.config.set({"cosim.search.precision": "fast"}):
        assert options.search_precision() == "fast"
    with dask.config.set({"cosim.search.tile-bytes": "1MiB"}):
        assert options.search_tile_bytes() == {"cpu": 2**20, "cuda": 2**20}
    with pytest.raises(ValueError, match=r"cosim\.search\.split-every=1 must be an integer >= 2"):
        options.search_split_every(1)
    # numpy's integers are integers, for every count (split-every refused them alone).
    with dask.config.set({"cosim.search.split-every": np.int64(4)}):
        assert options.search_split_every() == 4 and type(options.search_split_every()) is int
    with pytest.raises(ValueError, match=r"cosim.search.tile-bytes\['cpu'\]=0 must be a positive"):
        options.search_tile_bytes({"cpu": 0})


# --------------------------------------------------------------------------- the schema


def _package_yaml(name: str) -> Any:
    return yaml.safe_load(importlib.resources.files("dask_cosim").joinpath(name).read_text())


def _config_keys(node: Any, prefix: str = "") -> set[str]:
    """Dotted keys of the leaves of a config tree."""
    if not isinstance(node, dict):
        return {prefix.rstrip(".")}
    return {key for name, child in node.items() for key in _config_keys(child, f"{prefix}{name}.")}


def _schema_keys(schema: dict[str, Any], prefix: str = "") -> set[str]:
    """Dotted keys of the leaves a schema describes ($ref followed into definitions)."""
    ref = schema.get("$ref")
    if ref is not None:
        schema = _SCHEMA["definitions"][ref.rsplit("/", 1)[1]]
    # A map or one value for all its keys (bytes-per-device): the map's keys.
    schema = next((s for s in schema.get("oneOf", ()) if "properties" in s), schema)
    if "properties" not in schema:
        return {prefix.rstrip(".")}
    children = schema["properties"].items()
    return {key for name, child in children for key in _schema_keys(child, f"{prefix}{name}.")}


_SCHEMA = _package_yaml("cosim-schema.yaml")


def test_cosim_yaml_follows_its_schema() -> None:
    defaults = _package_yaml("cosim.yaml")
    jsonschema.validate(defaults, _SCHEMA)
    # Every default is described, and every described key has a default.
    assert _config_keys(defaults) == _schema_keys(_SCHEMA)
    assert {"cosim.dtype", "cosim.search.tile-bytes.cuda"} <= _config_keys(defaults)
    jsonschema.validate({"cosim": {"chunk-bytes": "1MiB"}}, _SCHEMA)  # one size for both


def test_the_docs_table_names_every_option() -> None:
    """docs/configuration.md (the README's "the cosim options") has a row per key."""
    docs = Path(dask_cosim.__file__).parents[1] / "docs" / "configuration.md"
    rows = re.findall(r"^\| `(cosim\.[\w.-]+)` \|", docs.read_text(), re.MULTILINE)
    assert sorted(rows) == sorted(_config_keys(_package_yaml("cosim.yaml")))


@pytest.mark.parametrize(
    "bad",
    [
        {"cosim": {"eps": -1}},
        {"cosim": {"device": "gpu"}},
        {"cosim": {"search": {"split-every": 1}}},
        {"cosim": {"chunk-bytes": {"tpu": "1MiB"}}},
        {"cosim": {"unknown": 1}},
        {"cosim": {"placement": {"gpu-fixed": -1}}},
        {"cosim": {"placement": {"cpu-fused": 0}}},
    ],
)
def test_the_schema_rejects_bad_values(bad: dict[str, Any]) -> None:
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, _SCHEMA)


def test_options_from_environment_variables() -> None:
    """DASK_COSIM__... variables name keys with underscores ("route_bytes"): the options
    still find them, and the defaults of the other keys of the section."""
    import os
    import subprocess
    import sys

    env = {
        **os.environ,
        "DASK_COSIM__SEARCH__CLUSTERED__ROUTE_BYTES": "1MiB",
        "DASK_COSIM__PLACEMENT__GPU_FIXED": "2ms",
        # One size for both device kinds, as dask.config.set takes it: dask's merge of
        # the defaults replaced it with their map, unsaid.
        "DASK_COSIM__CHUNK_BYTES": "1MiB",
    }
    code = (
        "from dask_cosim import options; c = options.clustered(); "
        "print(c.route_bytes, c.block_bytes, options.placement_rates().gpu_fixed, "
        "*options.chunk_bytes().values())"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [str(2**20), str(256 * 2**20), "0.002", *[str(2**20)] * 2]


def test_a_misspelt_key_is_named_with_the_closest_once() -> None:
    """dask.config ignores a key no default has; reading any option warns about each
    such key once, with the closest name.  ``_`` and ``-`` count alike (environment
    variables give ``chunk_bytes``)."""
    config_keys._WARNED.clear()
    with dask.config.set({"cosim.chunk-byte.cpu": "1MiB", "cosim.chunk_bytes.cpu": "1MiB",
                          "cosim.search.clustered.iteration": 3}):  # fmt: skip
        with pytest.warns(UserWarning) as caught:
            options.chunk_bytes()
            options.clustered()
        messages = sorted(str(w.message) for w in caught)
        assert messages == [
            "cosim.chunk-byte is not a dask_cosim option: it is ignored; did you mean "
            "'chunk-bytes'? (the options: docs/configuration.md)",
            "cosim.search.clustered.iteration is not a dask_cosim option: it is ignored; "
            "did you mean 'iterations'? (the options: docs/configuration.md)",
        ]
        assert caught[0].filename == __file__  # the caller's line, not ours
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            options.eps()  # once each
    assert config_keys.unknown_keys() == []

